# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
"""The one owner of the rule for a model that runs its repo's own Python code (issue 43 item 4).

vLLM's ``--trust-remote-code`` imports and runs the ``.py`` files of the model's repo at the revision served. A
branch or a tag can move to code nobody reviewed, so such a model serves only a commit someone chose: one pinned in
the catalog or its overrides, given with ``-e revision=<commit>``, the commit the slot already serves, or a fleet's
revision lock whose commit a run accepted with ``-e accept_remote_code=<commit>`` (or that was pinned when the lock
was written). The pivot, the rollout and ray_cluster ask here before anything changes.
"""
from __future__ import annotations

import json

from ansible_collections.llmfleet.vllm.plugins.module_utils.hf_download import COMMIT_RE
from ansible_collections.llmfleet.vllm.plugins.module_utils.serve_args import names_option

TRUST_OPTION = '--trust-remote-code'
# The revision lock's key naming the commit whose remote code a run accepted.
ACCEPTED_KEY = 'remote_code_accepted'


def runs_remote_code(entry):
    """Whether a catalog entry (profile applied) serves with remote code: trust_remote_code, or the option in
    extra_args."""
    serving = (entry or {}).get('serving') or {}
    return serving.get('trust_remote_code') is True or any(names_option(t, TRUST_OPTION) for t in serving.get('extra_args') or [])


def is_commit(revision):
    return isinstance(revision, str) and bool(COMMIT_RE.match(revision))


def lock_accepts(lock, commit):
    """Whether a revision lock vouches for ``commit``: a run accepted its remote code, or the lock was written from a
    revision that was the commit itself."""
    lock = lock or {}
    return bool(commit) and lock.get('commit') == commit and (
        lock.get(ACCEPTED_KEY) == commit or is_commit(lock.get('revision')))


def refusal(entry, wanted, commit, accepted='', lock=None, caller='pivot'):
    """'' when the entry may serve ``commit``, else why not and the command that accepts it.

    wanted: the revision asked for (-e revision=, the slot's served commit, the catalog's) - a commit pins itself;
    commit: what it resolved to on the hub (None when it was not resolved: check mode, a play that does not ask);
    accepted: -e accept_remote_code (a commit); lock: the revision lock the wanted revision came from, if it did;
    caller: pivot (-e revision=), rollout (which also records an acceptance in its lock) or ray_cluster (the entry's
    revision only): what the message offers.
    """
    if not runs_remote_code(entry):
        return ''
    if lock:
        # Check mode before the hub client is installed resolves nothing: the lock's own commit is what was asked.
        if lock_accepts(lock, commit or lock.get('commit')):
            return ''
    elif is_commit(wanted) and (not commit or wanted == commit):
        return ''
    if commit and accepted and str(accepted) == commit:
        return ''
    name = (entry or {}).get('name') or '(model)'
    resolved = ('commit %s' % commit) if commit else 'a commit not resolved here'
    if lock:
        why = ('the fleet\'s revision lock holds %s from revision %s, which no run accepted'
               % (resolved, json.dumps(lock.get('revision'))))
    else:
        why = ('revision %s is not a full commit (a branch, a tag or a short commit) and can move to code nobody reviewed '
               '(now %s)' % (json.dumps(wanted), resolved))
    if commit and accepted and str(accepted) != commit:
        why += '; -e accept_remote_code=%s names another commit' % accepted
    pin = commit or '<commit>'
    how = {'rollout': '-e revision=%s, or accept it for the fleet (kept in the revision lock) with -e accept_remote_code=%s'
                      % (pin, pin),
           'ray_cluster': 'revision: %s in its catalog entry or llmfleet_models_extra' % pin}.get(
        caller, '-e revision=%s, or revision: %s in its catalog entry or llmfleet_models_extra' % (pin, pin))
    return ('%s runs the Python code of its repo (trust_remote_code), and %s. Review that commit\'s code, then pin it: '
            '%s. Nothing was changed.' % (name, why, how))


def acceptance(commit, accepted):
    """What a rollout adds to its revision lock: the commit whose remote code -e accept_remote_code accepted (hosts'
    entries may differ, so it is kept whatever the first host's says)."""
    if commit and str(accepted or '') == commit:
        return {ACCEPTED_KEY: commit}
    return {}
