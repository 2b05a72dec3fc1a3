# -*- coding: utf-8 -*-
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
"""A pivot's downtime, as its record states it: from systemd beginning to stop the old unit (its journal entry, read
by the pivot's unit-stopped-at.py) to the new unit's first good /health, both on the host's CLOCK_MONOTONIC. The
controller's clock around the stop task stands in when the journal has no entry; a blue/green pivot has none (the old
model serves until the gateway switched); nothing served before, no downtime."""
from __future__ import annotations


def downtime(previous, strategy, old_stop=None, new_ready_monotonic_s=None, new_ready_at=None, old_stopped_at=None):
    """{source: none|blue_green|journal|controller, downtime_s, stopped_at (epoch seconds the old model began to stop)}.

    old_stop: {stopping_monotonic_s, now_at, now_monotonic_s} from the journal (stopping_monotonic_s None when the
    journal has no entry); new_ready_monotonic_s: service_deploy's first good /health on the monotonic clock;
    new_ready_at / old_stopped_at: the controller's epoch seconds around the start and the stop."""
    if not previous:
        return {'source': 'none', 'downtime_s': None, 'stopped_at': None}
    if strategy == 'blue_green':
        return {'source': 'blue_green', 'downtime_s': 0.0, 'stopped_at': None}
    old_stop = old_stop or {}
    stopping = old_stop.get('stopping_monotonic_s')
    if stopping is not None and new_ready_monotonic_s is not None:
        return {'source': 'journal', 'downtime_s': round(float(new_ready_monotonic_s) - float(stopping), 1),
                'stopped_at': round(float(old_stop['now_at']) - float(old_stop['now_monotonic_s']) + float(stopping), 3)}
    if new_ready_at is None or old_stopped_at is None:
        return {'source': 'controller', 'downtime_s': None, 'stopped_at': old_stopped_at}
    return {'source': 'controller', 'downtime_s': round(float(new_ready_at) - float(old_stopped_at), 1),
            'stopped_at': float(old_stopped_at)}
