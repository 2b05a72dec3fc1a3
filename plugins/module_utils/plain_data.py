# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
"""Ansible's values as plain Python data, at the door of a filter whose rules copy what they are given.

Ansible 2.19 passes a filter its own subclasses: lazily templated dicts and lists, tagged strings and numbers. A deep
copy of a lazy container copies its templating context, every variable of the host with it, so a copy costs more with
each fact a play has set: the catalog lookup went from 0.1 to 0.5 s over 20 facts in one play, and to 4 s a lookup in a
bulk refusal run (docs/testbed.md). Rebuilt once at the door, the rules copy plain data.
"""
from __future__ import annotations

from collections.abc import Mapping


def plain(value):
    """value rebuilt of plain dict, list, str, int, float and bool; any other value as it is."""
    if isinstance(value, Mapping):
        return {plain(key): plain(item) for key, item in value.items()}
    if isinstance(value, (list, tuple)):
        return [plain(item) for item in value]
    if isinstance(value, bool):
        return value
    for kind in (str, int, float):
        if isinstance(value, kind):
            return kind(value)
    return value
