# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
"""What each test module of `make test` costs in Ansible: the lines of tools/ci/callback_plugins/playbook_tally.py
summed per test module (or molecule scenario), largest controller CPU first, then the ten costliest tests.

    python3 tools/ci/playbook_tally.py tests/output/logs/playbooks.tsv
"""
from __future__ import annotations

import collections
import sys

FIELDS = ("runs", "ok", "changed", "skipped", "failed", "wall_s", "cpu_s")


def read(path: str) -> list:
    rows = []
    with open(path, encoding="utf-8") as handle:
        for line in handle:
            field = line.rstrip("\n").split("\t")
            if len(field) == 8:
                rows.append((field[0], field[1], *map(int, field[2:6]), *map(float, field[6:8])))
    return rows


def totals(rows: list, key) -> dict:
    summed = collections.defaultdict(lambda: [0] * len(FIELDS))
    for row in rows:
        entry = summed[key(row)]
        entry[0] += 1
        for i, value in enumerate(row[2:], start=1):
            entry[i] += value
    return summed


def show(title: str, summed: dict, limit: int) -> None:
    print("%-78s %5s %6s %6s %6s %5s %8s %8s" % ((title,) + FIELDS))
    for name, entry in sorted(summed.items(), key=lambda item: -item[1][-1])[:limit]:
        print("%-78s %5d %6d %6d %6d %5d %8.0f %8.0f" % ((name[-78:],) + tuple(entry)))


def main(path: str) -> int:
    rows = read(path)
    if not rows:
        print("%s: no playbook runs" % path)
        return 0
    modules = totals(rows, lambda row: row[0].split("::")[0])
    show("ansible-playbook runs per test module", modules, 40)
    every = [sum(entry[i] for entry in modules.values()) for i in range(len(FIELDS))]
    print("%-78s %5d %6d %6d %6d %5d %8.0f %8.0f" % (("all",) + tuple(every)))
    print()
    show("the ten tests whose runs took the most controller CPU", totals(rows, lambda row: row[0]), 10)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1] if len(sys.argv) > 1 else "tests/output/logs/playbooks.tsv"))
