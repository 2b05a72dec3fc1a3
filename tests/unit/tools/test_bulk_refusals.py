"""tests/integration/bulk_refusals.py (issue 41 item 4): the variables of each case typed as `-e` gives them, and a
play of playbooks/pivot.yml's own per case, for an inventory host of its own, whose refusal is written down."""
from __future__ import annotations

import os
import sys

import yaml

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))), "integration"))
import bulk_refusals  # noqa: E402  pylint: disable=wrong-import-position


def test_each_e_argument_is_typed_as_ansible_playbook_types_it():
    assert bulk_refusals.cli_vars(["-e", "pivot_port=8401", "-e", '{"gateway_api_keys": ["a", "b"]}', "-e", "x=a=b"]) == {
        "pivot_port": "8401", "gateway_api_keys": ["a", "b"], "x": "a=b"}
    # A later -e wins, as on the command line; key=value splits on blanks as ansible-playbook splits it.
    assert bulk_refusals.cli_vars(["-e", "slot=b", "-e", "slot=c"]) == {"slot": "c"}
    assert bulk_refusals.cli_vars(["-e", "slot=a b"]) == {"slot": "a", "_raw_params": "b"}
    assert bulk_refusals.cli_vars(["-e", '{"pivot_alias": "chat\\n"}']) == {"pivot_alias": "chat\n"}


def test_each_case_is_the_pivot_playbooks_play_for_its_own_alias_with_its_own_variables(tmp_path):
    with open(bulk_refusals.PIVOT_PLAYBOOK, encoding="utf-8") as handle:
        pivot = yaml.safe_load(handle)[0]
    plays = bulk_refusals._plays(["m-case00", "m-case01"], [{"model": "a", "slot": "B!"}, {"model": "b"}], tmp_path)
    assert [p["hosts"] for p in plays] == ["m-case00", "m-case01"]
    assert all(p["become"] == pivot["become"] and p["gather_subset"] == pivot["gather_subset"] for p in plays)
    assert plays[0]["vars"] == dict(pivot["vars"], model="a", slot="B!") and "slot" not in plays[1]["vars"]
    block = plays[0]["tasks"][0]
    assert block["block"][0]["ansible.builtin.include_role"] == {"name": pivot["roles"][0]["role"]}
    # A refused case writes its message on the controller; the run goes on to the next case.
    assert block["rescue"][0]["ansible.builtin.copy"]["dest"] == str(tmp_path / "m-case00")
    assert "ansible_failed_result" in block["rescue"][0]["ansible.builtin.copy"]["content"]
    assert block["block"][1]["ansible.builtin.copy"]["content"] == "ACCEPTED"
