# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
"""Filters of the LAN seeding of a rollout (module_utils/peer_seeding.py owns the rules): who copies from whom in a
round, how many rounds, and the per-rollout authorized_keys and known_hosts lines."""
from __future__ import annotations

from ansible.errors import AnsibleFilterError

from ansible_collections.llmfleet.vllm.plugins.module_utils import peer_seeding as _seed
from ansible_collections.llmfleet.vllm.plugins.module_utils.plain_data import plain


def _wrap(name, call, *args, **kwargs):
    try:
        return call(*plain(args), **plain(kwargs))
    except (_seed.SeedError, TypeError, ValueError) as exc:
        raise AnsibleFilterError('%s: %s' % (name, exc)) from exc


def seed_round(holders, targets, fanout=1, avoid=None):
    return _wrap('seed_round', _seed.plan_round, list(holders), list(targets), fanout, avoid)


def seed_state(holders, targets):
    return _wrap('seed_state', _seed.new_state, list(holders), list(targets))


def seed_after_copies(state, copies, plan):
    return _wrap('seed_after_copies', _seed.after_copies, state, copies, plan)


def seed_after_checks(state, checks):
    return _wrap('seed_after_checks', _seed.after_checks, state, checks)


def seed_rounds(holders, targets, fanout=1):
    return _wrap('seed_rounds', _seed.rounds_needed, holders, targets, fanout)


def seed_authorized_keys(pullers, source_dir, expiry, rrsync='/usr/bin/rrsync'):
    """pullers: [{name, address, public_key}] -> the lines of the source's authorized_keys."""
    return [_wrap('seed_authorized_keys', _seed.authorized_key_line, p['public_key'], source_dir, p.get('address'),
                  expiry, 'llmfleet-seed:%s' % p['name'], rrsync) for p in pullers]


def seed_known_hosts(sources):
    """sources: [{address, port, host_key}] -> known_hosts lines."""
    return [_wrap('seed_known_hosts', _seed.known_hosts_line, s['address'], s['port'], s['host_key']) for s in sources]


def seed_record(host, part, copies=None, fetched=None, fallback=None, bad_named=None):
    return _wrap('seed_record', _seed.host_record, host, part, copies, fetched, fallback, bad_named)


class FilterModule:
    def filters(self):
        return {'seed_round': seed_round, 'seed_state': seed_state, 'seed_after_copies': seed_after_copies,
                'seed_after_checks': seed_after_checks, 'seed_record': seed_record, 'seed_rounds': seed_rounds, 'seed_authorized_keys': seed_authorized_keys,
                'seed_known_hosts': seed_known_hosts}
