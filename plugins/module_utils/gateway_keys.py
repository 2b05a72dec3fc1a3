# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
"""The keys of the gateway's map files (roles/gateway): which keys a map file holds, and which given keys HAProxy could
not hold as one. The API keys and the metrics-only keys follow the same rules; this is their one owner."""
from __future__ import annotations

import re

# A key is a map line's first word at HAProxy and the token of "Authorization: Bearer <key>": printable ASCII without
# spaces, "," or "#".
KEY_RE = re.compile(r'[!-~]+\Z')
# A line an older release wrote: "Bearer <key> ok" (HAProxy took "Bearer" for the key).
OLD_LINE_RE = re.compile(r'^Bearer\s+(\S+)\s+ok\s*\Z')


def map_keys(text):
    """The keys a map file's text holds, in order: each line's first word, comments and blank lines left out."""
    keys = []
    for line in (text or '').splitlines():
        if not line.strip() or line.lstrip().startswith('#'):
            continue
        old = OLD_LINE_RE.match(line.strip())
        keys.append(old.group(1) if old else line.split()[0])
    return keys


def bad_key_positions(keys):
    """1-based positions of the keys that are not one HAProxy map word (never the keys themselves)."""
    return [i for i, key in enumerate(keys or [], 1)
            if not isinstance(key, str) or not KEY_RE.match(key) or ',' in key or '#' in key]
