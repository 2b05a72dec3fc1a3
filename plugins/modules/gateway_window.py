#!/usr/bin/python
# -*- coding: utf-8 -*-
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
from __future__ import annotations

DOCUMENTATION = r"""
---
module: gateway_window
short_description: Count what the host's gateway did with a slot's requests while a pivot had the slot closed
version_added: "0.9.0"
description:
  - Reads the gateway's (HAProxy's) log lines in the host's journal for the slot's closed window and returns how long
    the window was, how many of the slot's requests the gateway held and how long they waited (its request hold logs
    each wait as it ends), and how many it refused with 503 (the access log's lines of the slot's backend).
  - Counted at the gateway, not by a client; reads only.
author:
  - llmfleet maintainers (@llmfleet)
options:
  slot:
    description: The slot whose window is read (its backend is C(slot_<slot>)).
    type: str
    required: true
  closed_at:
    description: When the gateway stopped admitting the slot's requests, in epoch seconds of the host's clock.
    type: float
    required: true
  opened_at:
    description: When it admitted them again, in epoch seconds of the host's clock.
    type: float
    required: true
  settle_s:
    description: How long after O(opened_at) a held request's line still counts (a held request is let go as the window opens).
    type: float
    default: 5
  identifier:
    description: The journal's syslog identifier of the gateway's lines.
    type: str
    default: haproxy
extends_documentation_fragment:
  - llmfleet.vllm.attributes
"""

EXAMPLES = r"""
- name: Count the slot's held and refused requests of the pivot's window
  llmfleet.vllm.gateway_window:
    slot: default
    closed_at: 1796656921.85
    opened_at: 1796656964.37
  register: window
"""

RETURN = r"""
closed_s:
  description: Seconds from O(closed_at) to O(opened_at).
  returned: always
  type: float
held_requests:
  description: The slot's requests the gateway held in the window.
  returned: always
  type: int
held_wait_max_s:
  description: The longest wait of a held request (null when none was held).
  returned: always
  type: float
held_wait_p95_s:
  description: The 95th percentile of the held requests' waits (nearest rank; null when none was held).
  returned: always
  type: float
refused_requests:
  description: The slot's requests answered 503 in the window (past a hold bound, or without a hold).
  returned: always
  type: int
refused_at_bound:
  description: How many of those the hold refused at a bound (gateway_hold_s or gateway_hold_max).
  returned: always
  type: int
"""

import json
import math
import subprocess

from ansible.module_utils.basic import AnsibleModule
from ansible_collections.llmfleet.vllm.plugins.module_utils.gateway_window import window_stats


def journal_entries(identifier, since, until):
    """(epoch seconds, message) of the identifier's journal lines between since and until (whole seconds around)."""
    done = subprocess.run(['journalctl', '--no-pager', '-o', 'json', '-t', identifier,
                           '--since', '@%d' % math.floor(since - 1), '--until', '@%d' % math.ceil(until + 1)],
                          capture_output=True, text=True, check=False)
    if done.returncode != 0:
        raise RuntimeError('journalctl failed (%d): %s' % (done.returncode, done.stderr.strip()[-400:]))
    entries = []
    for line in done.stdout.splitlines():
        try:
            entry = json.loads(line)
        except ValueError:
            continue
        message = entry.get('MESSAGE')
        if isinstance(message, list):  # not UTF-8: journald gives the bytes
            message = bytes(message).decode('utf-8', 'replace')
        if isinstance(message, str) and str(entry.get('__REALTIME_TIMESTAMP', '')).isdigit():
            entries.append((int(entry['__REALTIME_TIMESTAMP']) / 1e6, message))
    return entries


def main():
    module = AnsibleModule(argument_spec={
        'slot': {'type': 'str', 'required': True},
        'closed_at': {'type': 'float', 'required': True},
        'opened_at': {'type': 'float', 'required': True},
        'settle_s': {'type': 'float', 'default': 5},
        'identifier': {'type': 'str', 'default': 'haproxy'},
    }, supports_check_mode=True)
    params = module.params
    if params['opened_at'] < params['closed_at']:
        module.fail_json(msg='opened_at %s is before closed_at %s' % (params['opened_at'], params['closed_at']))
    try:
        entries = journal_entries(params['identifier'], params['closed_at'], params['opened_at'] + params['settle_s'])
    except (OSError, RuntimeError) as error:
        module.fail_json(msg='cannot read the gateway log: %s' % error)
    module.exit_json(changed=False, **window_stats(entries, params['slot'], params['closed_at'], params['opened_at'],
                                                   params['settle_s']))


if __name__ == '__main__':
    main()
