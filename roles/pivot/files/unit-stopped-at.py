"""When did systemd last begin stopping a unit (this boot)? Read from the journal.

    unit-stopped-at.py UNIT

Prints JSON: stopping_monotonic_s (CLOCK_MONOTONIC of systemd's "Stopping UNIT..." entry, null when
the journal has none), now_monotonic_s and now_at (epoch seconds). The unit's own timestamps are no
use once it is stopped and disabled: systemd unloads it and forgets them.
"""
import json
import subprocess
import sys
import time

UNIT_STOPPING = "de5b426a63be47a7b6ac3eaac82e2f6f"  # SD_MESSAGE_UNIT_STOPPING


def main():
    out = subprocess.run(["journalctl", "-b", "-u", sys.argv[1], "MESSAGE_ID=" + UNIT_STOPPING, "-o", "json", "-n", "1",
                          "--no-pager"], capture_output=True, text=True, check=False).stdout.strip()
    stopping = int(json.loads(out.splitlines()[-1])["__MONOTONIC_TIMESTAMP"]) / 1e6 if out else None
    print(json.dumps({"stopping_monotonic_s": stopping,
                      "now_monotonic_s": round(time.clock_gettime(time.CLOCK_MONOTONIC), 3),
                      "now_at": round(time.time(), 3)}))


if __name__ == "__main__":
    main()
