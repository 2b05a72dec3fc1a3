"""Issue 43 item 4: a model that runs its repo's code serves only a commit someone chose (module_utils/remote_code.py);
the shipped catalog's entries that need it are refused from their branch until pinned."""
from __future__ import annotations

import pytest

from ansible_collections.llmfleet.vllm.plugins.filter.catalog import catalog_entry, load_catalog
from ansible_collections.llmfleet.vllm.plugins.module_utils import remote_code

SHA = "a1" * 20
OTHER = "b2" * 20


def _entry(**serving):
    return {"name": "m", "serving": serving}


@pytest.mark.parametrize("serving, runs", [
    ({"trust_remote_code": True}, True),
    ({"trust_remote_code": False}, False),
    ({}, False),
    # vLLM's parser: '_' for '-', any unambiguous prefix of the option.
    ({"extra_args": ["--trust-remote-code"]}, True),
    ({"extra_args": ["--trust_remote_code"]}, True),
    ({"extra_args": ["--trust-remote"]}, True),
    ({"extra_args": ["--tr"]}, True),
    ({"extra_args": ["--trust-remote-code=true"]}, True),
    ({"extra_args": ["--tokenizer", "--trust-remote-code-not"]}, False),
    ({"extra_args": ["--enforce-eager", "trust-remote-code"]}, False),
])
def test_what_runs_remote_code(serving, runs):
    assert remote_code.runs_remote_code(_entry(**serving)) is runs


def test_a_model_without_remote_code_serves_any_revision():
    assert remote_code.refusal(_entry(), "main", SHA) == ""


def test_a_branch_is_refused_naming_the_commit_and_the_command_that_pins_it():
    message = remote_code.refusal(_entry(trust_remote_code=True), "main", SHA)
    assert message == (
        'm runs the Python code of its repo (trust_remote_code), and revision "main" is not a full commit (a branch, a tag'
        ' or a short commit) and can move to code nobody reviewed (now commit %s). Review that commit\'s code, then pin it: -e revision=%s, or revision: %s'
        ' in its catalog entry or llmfleet_models_extra. Nothing was changed.' % (SHA, SHA, SHA))


@pytest.mark.parametrize("wanted, commit", [(SHA, SHA), (SHA, None)])
def test_a_commit_pins_itself(wanted, commit):
    assert remote_code.refusal(_entry(trust_remote_code=True), wanted, commit) == ""


def test_an_abbreviated_commit_or_a_tag_is_not_a_pin():
    assert remote_code.refusal(_entry(trust_remote_code=True), SHA[:12], SHA)
    assert remote_code.refusal(_entry(trust_remote_code=True), "v1.0", SHA)
    assert remote_code.refusal(_entry(trust_remote_code=True), SHA.upper(), SHA)


def test_a_rollout_accepts_the_commit_it_resolved_and_no_other():
    entry = _entry(trust_remote_code=True)
    assert remote_code.refusal(entry, "main", SHA, accepted=SHA, caller="rollout") == ""
    message = remote_code.refusal(entry, "main", SHA, accepted=OTHER, caller="rollout")
    assert "-e accept_remote_code=%s names another commit" % OTHER in message
    assert message.endswith("pin it: -e revision=%s, or accept it for the fleet (kept in the revision lock) with"
                            " -e accept_remote_code=%s. Nothing was changed." % (SHA, SHA)), message


def test_a_revision_lock_vouches_only_for_an_accepted_or_pinned_commit():
    entry = _entry(trust_remote_code=True)
    accepted = {"commit": SHA, "revision": "main", "remote_code_accepted": SHA}
    pinned = {"commit": SHA, "revision": SHA}
    unaccepted = {"commit": SHA, "revision": "main"}  # written from a branch, before this rule or without acceptance
    assert remote_code.refusal(entry, SHA, SHA, lock=accepted, caller="rollout") == ""
    assert remote_code.refusal(entry, SHA, SHA, lock=pinned, caller="rollout") == ""
    message = remote_code.refusal(entry, SHA, SHA, lock=unaccepted, caller="rollout")
    assert "the fleet's revision lock holds commit %s from revision \"main\", which no run accepted" % SHA in message
    assert remote_code.refusal(entry, SHA, SHA, accepted=SHA, lock=unaccepted, caller="rollout") == ""
    # Check mode resolves nothing before the hub client is installed: the lock's own commit is what was asked.
    assert remote_code.refusal(entry, SHA, None, lock=accepted, caller="rollout") == ""
    assert remote_code.refusal(entry, SHA, None, lock=unaccepted, caller="rollout")
    # An acceptance is of one commit: a lock whose commit moved does not carry it over.
    assert remote_code.refusal(entry, OTHER, OTHER, lock=dict(accepted, commit=OTHER), caller="rollout")


def test_what_the_lock_records():
    assert remote_code.acceptance(SHA, SHA) == {"remote_code_accepted": SHA}
    assert remote_code.acceptance(SHA, OTHER) == {} and remote_code.acceptance(SHA, "") == {}


def test_ray_cluster_is_told_to_pin_in_the_catalog():
    message = remote_code.refusal(_entry(trust_remote_code=True), "main", None, caller="ray_cluster")
    assert "(now a commit not resolved here)" in message
    assert message.endswith("pin it: revision: <commit> in its catalog entry or llmfleet_models_extra. Nothing was changed.")


def test_the_shipped_entries_with_remote_code_are_refused_until_pinned():
    """The catalog's trust_remote_code entries track a branch (their commits could not be confirmed): the breaking
    change of changelogs/fragments/0039-remote-code-pinned.yml."""
    catalog = load_catalog()
    needs = sorted(name for name in catalog if remote_code.runs_remote_code(catalog_entry(name)))
    assert needs == ["glm5-fp8", "glm5-nvfp4", "kimi-k25-int4", "kimi-k25-nvfp4", "minimax-m25"], needs
    for name in needs:
        entry = catalog_entry(name)
        assert remote_code.refusal(entry, entry["revision"], SHA) == "" if remote_code.is_commit(entry["revision"]) \
            else remote_code.refusal(entry, entry["revision"], SHA).startswith(name + " runs the Python code"), name
