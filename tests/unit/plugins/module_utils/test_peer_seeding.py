"""The rules of LAN seeding (module_utils/peer_seeding.py): rounds, state between rounds, access lines, rsync."""
from __future__ import annotations

import pytest

from ansible_collections.llmfleet.vllm.plugins.module_utils import peer_seeding as seed

KEY = "ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIEa8dW7Qp0uH2l2s7Q1M5m0kI4h7y7oX8bOZC0K9h2mB"


def test_copies_double_each_round_with_fanout_1():
    holders, pending, rounds = ["h1"], ["h%d" % i for i in range(2, 33)], 0
    while pending:
        plan = seed.plan_round(holders, pending, 1)
        assert len(plan) == min(len(holders), len(pending))
        assert len({sources[0] for sources in plan.values()}) == len(plan)  # one target per source
        holders, pending, rounds = holders + list(plan), [p for p in pending if p not in plan], rounds + 1
    assert rounds == 5 == seed.rounds_needed(1, 31, 1)


def test_fanout_bounds_each_source_even_with_its_fallbacks():
    plan = seed.plan_round(["a", "b"], ["t1", "t2", "t3", "t4", "t5"], 2)
    assert sorted(plan) == ["t1", "t2", "t3", "t4"]
    assert [plan[t][0] for t in ("t1", "t2", "t3", "t4")] == ["a", "b", "a", "b"]
    assert plan["t1"] == ["a"]  # b serves two already: no fallback beyond the bound
    assert seed.plan_round(["a", "b", "c"], ["t1"], 1) == {"t1": ["a", "b", "c"]}
    assert seed.rounds_needed(2, 5, 2) == 2


def test_a_source_named_bad_for_a_target_is_never_its_source_again():
    plan = seed.plan_round(["a", "b"], ["t"], 1, avoid={"t": ["a"]})
    assert plan == {"t": ["b"]}
    assert seed.plan_round(["a"], ["t"], 1, avoid={"t": ["a"]}) == {}


@pytest.mark.parametrize("bad", [0, "x", -1])
def test_bad_fanout_is_refused(bad):
    with pytest.raises((seed.SeedError, ValueError)):
        seed.plan_round(["a"], ["b"], bad)


def attempt(source, result, error="", rc=0):
    return {"source": source, "result": result, "error": error, "rc": rc}


def test_state_after_a_round_with_a_kill_and_a_flipped_byte():
    state = seed.new_state(["r1", "r2"], ["r1", "r2", "r3", "r4"])
    assert state["pending"] == ["r3", "r4"]
    plan = {"r3": ["r1", "r2"], "r4": ["r2", "r1"]}
    copies = {
        # r1 killed mid-copy, r2 sent a bad file, then r1 again... r3 ends verified from r1 after the bad r2 file
        "r3": {"verified": True, "attempts": [attempt("r1", "failed"), attempt("r2", "bad"), attempt("r1", "verified")],
               "bad_sources": {"r2": ["model-00002.safetensors"]}},
        "r4": {"verified": True, "attempts": [attempt("r2", "bad"), attempt("r1", "verified")],
               "bad_sources": {"r2": ["model-00002.safetensors"]}},
    }
    state = seed.after_copies(state, copies, plan)
    assert state["holders"] == ["r1", "r3", "r4"] and state["pending"] == []
    assert state["suspects"] == ["r2"] and state["avoid"] == {"r3": ["r2"], "r4": ["r2"]}
    assert state["bad_named"]["r2"] == ["model-00002.safetensors (to r3)", "model-00002.safetensors (to r4)"]
    failed_check = seed.after_checks(state, {"r2": False})
    assert failed_check["pending"] == ["r2"] and failed_check["suspects"] == []
    passed_check = seed.after_checks(state, {"r2": True})
    assert passed_check["holders"][-1] == "r2" and passed_check["pending"] == []


def test_a_target_no_peer_can_serve_is_given_up_for_the_hub():
    state = seed.new_state(["r1"], ["r2"])
    copies = {"r2": {"verified": False, "attempts": [attempt("r1", "failed", "rsync exited 255: Connection refused", 255)],
                     "bad_sources": {}}}
    state = seed.after_copies(state, copies, {"r2": ["r1"]})
    assert state["pending"] == [] and "Connection refused" in state["no_peer"]["r2"]
    refused = {"r2": {"verified": False, "bad_sources": {},
                      "attempts": [attempt("r1", "failed", "rsync exited 12: Permission denied (publickey)", 12)]}}
    assert seed.after_copies(seed.new_state(["r1"], ["r2"]), refused, {"r2": ["r1"]})["pending"] == []


def test_a_source_whose_copy_lacks_files_is_suspected_and_a_failed_task_is_a_failed_round():
    state = seed.new_state(["r1", "r2"], ["r3"])
    copies = {"r3": {"verified": True, "attempts": [attempt("r1", "incomplete"), attempt("r2", "verified")],
                     "bad_sources": {}}}
    state = seed.after_copies(state, copies, {"r3": ["r1", "r2"]})
    assert state["suspects"] == ["r1"] and state["holders"] == ["r2", "r3"] and state["avoid"] == {"r3": ["r1"]}
    timed_out = seed.after_copies(seed.new_state(["r1"], ["r2"]), {"r2": {"failed": True, "msg": "async timeout"}},
                                  {"r2": ["r1"]})
    assert timed_out["pending"] == ["r2"] and timed_out["failed_rounds"] == {"r2": 1}


def test_ssh_failing_after_bytes_came_is_a_dead_peer_not_an_unreachable_one():
    state = seed.new_state(["r1"], ["r2"])
    copies = {"r2": {"verified": False, "bad_sources": {},
                     "attempts": [dict(attempt("r1", "failed", "rsync exited 255", 255), bytes=1_000_000)]}}
    assert seed.after_copies(state, copies, {"r2": ["r1"]})["pending"] == ["r2"]
    assert state["failed_rounds"] == {}  # the state given is left as it was


def test_a_source_that_died_mid_copy_is_tried_again_next_round_up_to_a_limit():
    state = seed.new_state(["r1"], ["r2"])
    died = {"r2": {"verified": False, "bad_sources": {},
                   "attempts": [dict(attempt("r1", "failed", "rsync exited 12: connection closed", 12), bytes=500_000)]}}
    for round_number in range(1, seed.MAX_FAILED_ROUNDS):
        state = seed.after_copies(state, died, {"r2": ["r1"]})
        assert state["pending"] == ["r2"] and state["failed_rounds"]["r2"] == round_number
    state = seed.after_copies(state, died, {"r2": ["r1"]})
    assert state["pending"] == [] and "connection closed" in state["no_peer"]["r2"]
    # A skipped or unplanned host changes nothing.
    assert seed.after_copies(seed.new_state(["r1"], ["r2"]), {"r2": {"skipped": True}}, {"r2": ["r1"]})["pending"] == ["r2"]


def test_authorized_key_line_forces_a_read_only_rsync_of_one_directory():
    line = seed.authorized_key_line(KEY + " someone@host", "/srv/models/tiny--0123456789ab", "10.0.0.5",
                                    "202612051800Z", "llmfleet-seed:gpu-02")
    assert line == ('command="/usr/bin/rrsync -ro /srv/models/tiny--0123456789ab/",restrict,from="10.0.0.5",'
                    'expiry-time="202612051800Z" %s llmfleet-seed:gpu-02' % KEY)
    assert 'expiry-time="202612051800"' in seed.authorized_key_line(KEY, "/srv/models/x", None, "202612051800")
    assert "from=" not in seed.authorized_key_line(KEY, "/srv/models/x", "gpu_02.lan.", None)
    # Checked, never written as given (issue 43): a list or a pattern would widen what the key is bound to.
    with pytest.raises(seed.SeedError, match="must be an IP address or a host name"):
        seed.authorized_key_line(KEY, "/srv/models/x", "10.0.0.1,0.0.0.0/0", None)


@pytest.mark.parametrize("path", ["/srv/models/a b", '/srv/"x', "relative", "/srv/models/../etc", "/srv/$(id)", "/", "//",
                                  "/./", "/srv/./models"])
def test_a_directory_that_could_escape_the_forced_command_is_refused(path):
    with pytest.raises(seed.SeedError, match="model directory"):
        seed.authorized_key_line(KEY, path)


def test_known_hosts_and_rsync_command_line():
    assert seed.known_hosts_line("127.0.0.1", 2271, KEY + " root@x") == "[127.0.0.1]:2271 " + KEY
    assert seed.known_hosts_line("10.0.0.1", 22, KEY) == "10.0.0.1 " + KEY
    assert seed.known_hosts_line("gpu-01.lan", 22, KEY) == "gpu-01.lan " + KEY
    # A newline would add a line of its own (a key for any host); a pattern would match other hosts (issue 43).
    for address in ("10.0.0.1\n* " + KEY, "*", "gpu-01 gpu-02", "!gpu-01"):
        with pytest.raises(seed.SeedError, match="a source's address must be"):
            seed.known_hosts_line(address, 22, KEY)
    argv = seed.rsync_argv("llmfleet-seed", "::1", 22, "/srv/models/m", "/run/k", "/run/kh", 2048, 60)
    assert argv[-2:] == ["llmfleet-seed@[::1]:/", "/srv/models/m/"]
    assert "--bwlimit=2048" in argv and "--ignore-existing" in argv and "--recursive" not in argv
    assert "--links" not in argv and "--files-from=/run/list" in seed.rsync_argv(
        "llmfleet-seed", "h", 22, "/d", "/k", "/kh", files_from="/run/list")
    assert seed.copy_list({"files": [{"path": "config.json"}]}) == ["config.json", ".cache/llmfleet/originals/config.json"]
    rsh = argv[argv.index("--rsh") + 1]
    assert "StrictHostKeyChecking=yes" in rsh and "UserKnownHostsFile=/run/kh" in rsh and "IdentitiesOnly=yes" in rsh
    assert "-F /dev/null" in rsh  # root's ~/.ssh/config cannot change what the copy trusts
    with pytest.raises(seed.SeedError):
        seed.rsync_argv("root;id", "h", 22, "/d", "/k", "/kh")


def test_stats_and_finished_files_are_read_from_rsync_output():
    out = ("llmfleet-done 1234 config.json\nllmfleet-done 0 sub/\nllmfleet-done 6,874,112 x\n"
           "Number of regular files transferred: 9\nLiteral data: 6,874,112 bytes\nMatched data: 1,024 bytes\n")
    assert seed.finished_files(out) == {"config.json": 1234}
    assert seed.parse_stats(out) == {"literal": 6874112, "matched": 1024, "received": 0, "transferred_files": 9}


def test_host_record_says_where_the_bytes_came_from():
    copies = [{"round": 1, "verified": False, "seconds": 2.0,
               "attempts": [{"source": "r1", "result": "failed", "bytes": 1_200_000, "seconds": 1.5}]},
              {"round": 2, "verified": True, "seconds": 3.0,
               "attempts": [{"source": "r2", "result": "verified", "bytes": 3_100_000, "bytes_matched": 1_200_000,
                             "seconds": 3.0}]}]
    record = seed.host_record("r3", "target", copies)
    assert record["how"] == "peers" and record["bytes_by_source"] == {"r1": 1_200_000, "r2": 3_100_000}
    assert record["detail"] == "1.2 MB from r1 in 1.5 s (round 1, failed); 3.1 MB from r2 in 3.0 s (round 2, verified)"
    hub = seed.host_record("r1", "target", [], {"bytes_downloaded": 4_300_000, "seconds": 4.0, "verify_seconds": 0.5})
    assert hub["how"] == "hub" and hub["sources_text"] == "hub: 4.3 MB" and hub["seconds"] == 4.5
    fallback = seed.host_record("r4", "target", copies[:1], {"bytes_downloaded": 900, "seconds": 1}, "no peer")
    assert fallback["how"] == "hub fallback" and "900 B from the hub in 1.0 s (fallback: no peer)" in fallback["detail"]
    check = seed.host_record("r2", "target", [], {"check_mode": True, "bytes_to_download": 6_900_000})
    assert check["how"] == "check mode: nothing fetched" and "6.9 MB" in check["detail"]
    assert seed.host_record("r5", "none")["how"].startswith("takes no part")
    assert seed.host_record("r6", "holder")["how"] == "held a verified copy"
