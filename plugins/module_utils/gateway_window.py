# -*- coding: utf-8 -*-
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
"""What the gateway did with a slot's requests while a pivot had the slot closed, read from HAProxy's own log lines
(issue 44 item 3): the requests held and how long each waited (the hold's line, roles/gateway/files/llmfleet-hold.lua,
logged as the wait ends), and the requests refused (the access log's 503 from the slot's backend: past a hold bound,
or with no hold at all)."""
from __future__ import annotations

import math
import re

# The hold's own line, as syslog carries it: "llmfleet-hold slot=<slot> held 12.3 s" (or "refused: ...", "ended: ...").
# Anchored: HAProxy 2.6 also prints each Lua log line to its stderr ("[info] 340/152024 (6926) : llmfleet-hold ..."),
# which the journal keeps under the same identifier; that copy is not counted.
HOLD_RE = re.compile(r'^llmfleet-hold slot=(?P<slot>\S+) (?P<verdict>held|refused|ended):? (?P<rest>.*)$')
WAITED_RE = re.compile(r'(?:^|waited )(?P<seconds>[0-9]+(?:\.[0-9]+)?) s\b')
# The access log (haproxy.cfg.j2's log-format, httplog's fields first): "... frontend backend/server times status ...".
ACCESS_RE = re.compile(r'\] \S+ (?P<backend>[^/\s]+)/(?P<server>\S+) -?[0-9]+/-?[0-9]+/-?[0-9]+/-?[0-9]+/-?[0-9]+ (?P<status>[0-9]{3}) ')
# The gateway's /health answers 503 while the slot is closed, by design (it is never held): not a client refused.
HEALTH_RE = re.compile(r'"(?:GET|HEAD) /health[ ?]')


def percentile(values, share):
    """The nearest-rank percentile (share in 0..1) of values, None for none."""
    if not values:
        return None
    ordered = sorted(values)
    return ordered[max(0, math.ceil(share * len(ordered)) - 1)]


def window_stats(entries, slot, closed_at, opened_at, settle_s=5.0):
    """entries: (epoch seconds, message) of the gateway's log. The slot's window is closed_at..opened_at (the host's
    clock). Held: the hold's lines of the slot that end within the window or up to settle_s after its end (a held
    request is let go when the window opens). Refused: the access log's 503s of the slot's backend within the window.
    Returns {closed_s, held_requests, held_wait_max_s, held_wait_p95_s, refused_requests, refused_at_bound}."""
    backend = 'slot_%s' % slot
    waits, refused, at_bound = [], 0, 0
    for at, message in entries:
        hold = HOLD_RE.match(message)
        if hold and hold.group('slot') == slot and closed_at <= at <= opened_at + settle_s:
            if hold.group('verdict') == 'held':
                waited = WAITED_RE.search(hold.group('rest'))
                waits.append(float(waited.group('seconds')) if waited else 0.0)
            elif hold.group('verdict') == 'refused':
                at_bound += 1
            continue
        access = ACCESS_RE.search(message)
        if access and access.group('backend') == backend and access.group('status') == '503' and closed_at <= at <= opened_at \
                and not HEALTH_RE.search(message):
            refused += 1
    return {
        'closed_s': round(opened_at - closed_at, 1),
        'held_requests': len(waits),
        'held_wait_max_s': round(max(waits), 1) if waits else None,
        'held_wait_p95_s': round(percentile(waits, 0.95), 1) if waits else None,
        'refused_requests': refused,
        'refused_at_bound': at_bound,
    }
