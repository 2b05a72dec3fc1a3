"""What Prometheus learns from a host's state (issue #31): the file_sd targets of a host's slots and the textfile of
its slots and last pivots, from the slot records and pivot records of the GPU run (tests/fixtures/nvidia/h100-pivot-wake-*),
linted by Debian's promtool."""
from __future__ import annotations

import json
import pathlib
import re
import subprocess

import pytest
from ansible.errors import AnsibleFilterError

from ansible_collections.llmfleet.vllm.plugins.filter import observability as filters
from ansible_collections.llmfleet.vllm.plugins.filter import results_paths as path_filters
from ansible_collections.llmfleet.vllm.plugins.module_utils import observability as obs
from ansible_collections.llmfleet.vllm.plugins.module_utils import results_paths

FIX = pathlib.Path(__file__).resolve().parents[3] / "fixtures" / "nvidia"
RECORDS = json.loads((FIX / "h100-pivot-wake-records.json").read_text())
A, B = "9d6c3419f97c83b6c55f930204a80f4c38ad80e1", "671caf60d3d53a5bbdecb74e51ef779c57af922d"
SLOTS = {
    "default": {"model": "llama1b-a", "alias": "chat", "port": 8000, "standby_port": 8001, "gateway": True,
                "gpu_ids": [0, 1], "revision": A, "since": 1796466359.399, "unit": "vllm-llama1b-a.service"},
    "batch": {"model": "llama1b-b", "alias": "batch", "port": 8010, "gateway": False, "gpu_ids": [2], "revision": B},
    "empty": {"model": None, "port": None},
}

SAMPLE_RE = re.compile(r'^(?P<name>[a-zA-Z_:][a-zA-Z0-9_:]*)\{(?P<labels>.*)\} (?P<value>\S+)$')


def samples(text):
    """[(name, {label: value}, value)] of a textfile (the tests' own small reader of the format)."""
    out = []
    for line in text.splitlines():
        if line.startswith("#"):
            continue
        match = SAMPLE_RE.match(line)
        assert match, line
        labels = dict(re.findall(r'(\w+)="((?:[^"\\]|\\.)*)"', match["labels"]))
        out.append((match["name"], labels, float(match["value"])))
    return out


def value(text, name, **labels):
    found = [v for n, ls, v in samples(text) if n == name and all(ls.get(k) == val for k, val in labels.items())]
    assert len(found) == 1, (name, labels, found)
    return found[0]


def test_a_slot_behind_the_gateway_is_scraped_through_its_metrics_listener_with_the_slots_labels():
    groups = filters.prometheus_targets(SLOTS, "gpu-01", "10.0.0.11", 8405, 9100, {"default": "0.26.0"},
                                        {"llama1b-a": A, "llama1b-b": A}, {"datacenter": "ams1"})
    by_job = {(g["labels"]["job"], g["labels"].get("slot")): g for g in groups}
    assert set(by_job) == {("llmfleet_vllm", "default"), ("llmfleet_vllm", "batch"), ("llmfleet_gateway", None),
                           ("llmfleet_node", None)}
    default = by_job[("llmfleet_vllm", "default")]
    assert default == {"targets": ["10.0.0.11:8405"], "labels": {
        "job": "llmfleet_vllm", "__metrics_path__": "/slot/default/metrics", "host": "gpu-01", "slot": "default",
        "model": "llama1b-a", "alias": "chat", "revision": A, "gpu_ids": "0,1", "engine_version": "0.26.0",
        "revision_locked": "true", "datacenter": "ams1"}}
    # Without a gateway: the slot's own port; its revision is not the fleet's lock.
    batch = by_job[("llmfleet_vllm", "batch")]
    assert (batch["targets"], batch["labels"]["__metrics_path__"], batch["labels"]["revision_locked"]) == \
        (["10.0.0.11:8010"], "/metrics", "false")
    assert by_job[("llmfleet_gateway", None)]["targets"] == ["10.0.0.11:8405"]
    assert by_job[("llmfleet_node", None)]["targets"] == ["10.0.0.11:9100"]
    # No gateway metrics listener, no node_exporter: only the slot on its own port.
    assert [g["labels"]["slot"] for g in filters.prometheus_targets(SLOTS, "gpu-01", "10.0.0.11")] == ["batch"]
    assert filters.slot_metrics_path("default") == "/slot/default/metrics"
    assert filters.prometheus_targets_file("gpu-01.lab") == "llmfleet-gpu-01.lab.json"


def test_a_tls_gateway_is_scraped_over_https_and_an_ipv6_address_in_brackets():
    """Issue 46 item 3 (docs/observability.md, limits): a gateway with gateway_tls_cert_file serves its metrics listener
    over TLS, so what is scraped through it says __scheme__ https (a slot on its own port and node_exporter do not); an
    IPv6 address is a target in brackets, as Prometheus parses host:port."""
    groups = filters.prometheus_targets(SLOTS, "gpu-01", "2001:db8::11", 8405, 9100, None, None, None, True)
    by_job = {(g["labels"]["job"], g["labels"].get("slot")): g for g in groups}
    assert {key: (g["targets"], g["labels"].get("__scheme__")) for key, g in by_job.items()} == {
        ("llmfleet_vllm", "default"): (["[2001:db8::11]:8405"], "https"),
        ("llmfleet_vllm", "batch"): (["[2001:db8::11]:8010"], None),
        ("llmfleet_gateway", None): (["[2001:db8::11]:8405"], "https"),
        ("llmfleet_node", None): (["[2001:db8::11]:9100"], None)}
    # Given in brackets already, or as an IPv4 address or a name: as it is.
    assert filters.prometheus_targets(SLOTS, "gpu-01", "[2001:db8::11]")[0]["targets"] == ["[2001:db8::11]:8010"]
    assert filters.prometheus_targets(SLOTS, "gpu-01", "gpu-01.lab")[0]["targets"] == ["gpu-01.lab:8010"]
    assert "__scheme__" not in str(filters.prometheus_targets(SLOTS, "gpu-01", "10.0.0.11", 8405, 9100))


@pytest.mark.parametrize("labels, message", [
    ({"slot": "x"}, "observability_target_labels: the label slot clashes with a label the collection sets"),
    ({"job": "x"}, "the label job clashes"),
    ({"__address__": "x"}, 'observability_target_labels: "__address__" is not a Prometheus label name'),
    ({"data-center": "x"}, '"data-center" is not a Prometheus label name'),
    ({"rack": ["a"]}, "the value of rack must be a string or a number"),
    ("rack=a", "observability_target_labels must be a mapping"),
])
def test_a_label_that_clashes_or_is_no_label_name_is_refused_naming_the_variable(labels, message):
    with pytest.raises(AnsibleFilterError, match=re.escape(message)):
        filters.prometheus_targets(SLOTS, "gpu-01", "10.0.0.11", 8405, None, None, None, labels)


def test_a_host_or_address_that_cannot_go_into_a_targets_file_is_refused():
    with pytest.raises(AnsibleFilterError, match="inventory name of letters"):
        filters.prometheus_targets_file("../etc/passwd")
    with pytest.raises(AnsibleFilterError, match="observability_scrape_address must be one IP address"):
        filters.prometheus_targets(SLOTS, "gpu-01", "10.0.0.11 9.9.9.9")
    with pytest.raises(AnsibleFilterError, match="slot_metrics_path: slot must be a slot name"):
        filters.slot_metrics_path("a/../b")


def test_the_textfile_says_what_the_pivot_records_say(prometheus_bin):
    """The last record of a slot wins (the one that ended last; records are named <UTC stamp of the end>-<model>...);
    its figures reach the metrics as recorded, and promtool finds the text well formed."""
    passed = RECORDS["pivot-wakeback-record.json"]
    rolled_back = RECORDS["20261205T103249Z-gpuhost-llama1b-b-rolled-back.json"]
    named = [("20261205T103249Z-llama1b-b-rolled-back.json", dict(rolled_back, slot="batch")),
             ("20261205T101500Z-llama1b-b.json", dict(passed, slot="batch", downtime_s=99.0,
                                                      new_ready_at=rolled_back["rollback"]["serving_at"] - 1749)),
             ("20261205T104500Z-llama1b-a.json", passed), ("20261205T104400Z-cut-short.json", None)]
    slots = dict(SLOTS, default=dict(SLOTS["default"], pivot={"phase": "switching", "since": 1796466900.5}))
    text = obs.slot_metrics_text(slots, named, {"llama1b-a": A})
    check = subprocess.run([prometheus_bin + "/promtool", "check", "metrics"], input=text, capture_output=True, text=True,
                           check=False)
    assert check.returncode == 0, check.stdout + check.stderr + text

    assert value(text, "llmfleet_pivot_last_downtime_seconds", slot="default") == passed["downtime_s"]
    assert value(text, "llmfleet_pivot_last_timestamp_seconds", slot="default") == passed["new_ready_at"]
    # Issue 44: the gateway's window of a stop-then-start as the record counted it; a pivot without one has no sample.
    window = {"closed_s": 42.5, "held_requests": 4, "held_wait_max_s": 32.1, "held_wait_p95_s": 32.1,
              "refused_requests": 1, "refused_at_bound": 1}
    held_text = obs.slot_metrics_text(SLOTS, [("20261205T104500Z-llama1b-a.json", dict(passed, gateway_window=window))],
                                      {"llama1b-a": A})
    assert [value(held_text, name, slot="default") for name in (
        "llmfleet_pivot_last_closed_seconds", "llmfleet_pivot_last_held_requests",
        "llmfleet_pivot_last_held_wait_max_seconds", "llmfleet_pivot_last_refused_requests")] == [42.5, 4, 32.1, 1]
    assert not [n for n, _ls, _value in samples(text) if n == "llmfleet_pivot_last_closed_seconds"]
    # A figure the record does not have (a wake loads nothing) is no sample, not a 0 a dashboard would draw.
    assert passed["load_time_s"] is None
    assert not [n for n, ls, _value in samples(text) if n == "llmfleet_pivot_last_load_seconds" and ls["slot"] == "default"]
    assert value(text, "llmfleet_pivot_last_result", slot="default", result="passed") == 1
    assert value(text, "llmfleet_pivot_last_result", slot="default", result="rolled_back") == 0
    info = [ls for n, ls, _value in samples(text) if n == "llmfleet_pivot_last_info" and ls["slot"] == "default"][0]
    assert (info["model"], info["previous_model"], info["revision"], info["strategy"]) == \
        (passed["model"], passed["previous_model"], passed["revision"], passed["strategy"])
    for level in passed["gate"]:
        at = {"slot": "default", "concurrency": str(level["concurrency"])}
        assert value(text, "llmfleet_pivot_last_gate_output_tokens_per_second", **at) == pytest.approx(level["output_tok_s"])
        assert value(text, "llmfleet_pivot_last_gate_output_tokens_per_second_ci_low", **at) == \
            pytest.approx(level["output_tok_s_ci"]["low"])
        assert value(text, "llmfleet_pivot_last_gate_itl_seconds", percentile="99", **at) == pytest.approx(level["itl_s"]["p99"])
    # The benchmark after the pivot (H200 record of roles/benchmark) joins the record: its levels are metrics too.
    bench = json.loads((FIX / "h200-vllm-bench-record.json").read_text())
    with_bench = obs.slot_metrics_text(slots, [("20261205T104500Z-llama1b-a.json", dict(passed, benchmark={"levels": bench["levels"]}))])
    for level in bench["levels"]:
        at = {"slot": "default", "concurrency": str(level["concurrency"])}
        assert value(with_bench, "llmfleet_pivot_last_benchmark_output_tokens_per_second", **at) == \
            pytest.approx(level["output_tok_s"])
        assert value(with_bench, "llmfleet_pivot_last_benchmark_ttft_seconds", percentile="99", **at) == \
            pytest.approx(level["ttft_s"]["p99"])
    assert subprocess.run([prometheus_bin + "/promtool", "check", "metrics"], input=with_bench, capture_output=True,
                          text=True, check=False).returncode == 0
    # Slot batch: the rolled-back pivot is later than the passed one.
    assert value(text, "llmfleet_pivot_last_result", slot="batch", result="rolled_back") == 1
    assert value(text, "llmfleet_pivot_last_rollback_seconds", slot="batch") == rolled_back["rollback"]["seconds"]
    assert value(text, "llmfleet_pivot_last_timestamp_seconds", slot="batch") == rolled_back["rollback"]["serving_at"]
    assert not [n for n, ls, _value in samples(text) if n == "llmfleet_pivot_last_downtime_seconds" and ls["slot"] == "batch"]
    # The slots: what each serves, a pivot begun and not ended, the fleet's lock.
    assert value(text, "llmfleet_slot_pivot_in_progress", slot="default") == 1
    assert value(text, "llmfleet_slot_pivot_started_timestamp_seconds", slot="default") == 1796466900.5
    assert value(text, "llmfleet_slot_pivot_in_progress", slot="batch") == 0
    assert value(text, "llmfleet_slot_revision_locked", slot="default", locked_revision=A) == 1
    assert value(text, "llmfleet_slot_info", slot="default", model="llama1b-a", port="8000", gpu_ids="0,1") == 1
    assert not [ls for n, ls, _value in samples(text) if n == "llmfleet_slot_info" and ls["slot"] == "empty"]
    # Nothing in the text depends on when it was written: a re-run writes the same bytes.
    assert obs.slot_metrics_text(slots, list(reversed(named)), {"llama1b-a": A}) == text


def test_label_values_are_escaped():
    text = obs.slot_metrics_text({"a": {"model": 'm"x\\y\nz', "port": 1}})
    assert 'model="m\\"x\\\\y\\nz"' in text


def test_revision_locks_are_read_from_the_results(tmp_path):
    (tmp_path / "locks").mkdir()
    (tmp_path / "locks" / "m.json").write_text(json.dumps({"model": "m", "commit": A}))
    (tmp_path / "locks" / "broken.json").write_text("{")
    assert path_filters.revision_locks(str(tmp_path)) == {"m": A}
    assert path_filters.revision_locks(str(tmp_path / "none")) == {}
    assert path_filters.revision_lock_path(str(tmp_path), "m") == str(tmp_path / "locks" / "m.json")
    with pytest.raises(AnsibleFilterError, match="revision_lock_path"):
        path_filters.revision_lock_path(str(tmp_path), "a/b")


def test_a_folder_of_json_files_is_read_by_name_and_its_broken_files_skipped(tmp_path):
    (tmp_path / "b.json").write_text('{"n": 2}')
    (tmp_path / "a.json").write_text("[1]")
    (tmp_path / "cut.json").write_text("{")
    (tmp_path / "notes.txt").write_text("{}")
    (tmp_path / "dir.json").mkdir()
    assert results_paths.read_json_files(str(tmp_path)) == [("a.json", [1]), ("b.json", {"n": 2})]
    assert results_paths.read_json_files(str(tmp_path / "none")) == []
    with pytest.raises(OSError):
        results_paths.read_json_files(str(tmp_path), broken=(ValueError,))


def test_a_slots_last_pivot_is_the_one_that_ended_last_whatever_its_file_is_called():
    """Issue 42: a rolled-back record was named after the controller's clock, a committed one after the host's ready
    time; the latest is read from the records' own end (record_time), the name only breaking ties."""
    passed = {"slot": "default", "result": "passed", "new_ready_at": 200.0}
    rolled_back = {"slot": "default", "result": "rolled_back", "rollback": {"serving_at": 300.0}}
    other = {"slot": "b", "result": "passed", "new_ready_at": 100.0}
    named = [("19700101T000459Z-a-rolled-back.json", rolled_back), ("19700101T000500Z-b.json", passed),
             ("19700101T000140Z-c.json", other)]
    assert obs.latest_records(named) == {"default": rolled_back, "b": other}
    same_second = [("19700101T000320Z-b.json", dict(passed, new_ready_at=200.0)), ("19700101T000320Z-a.json", passed)]
    assert obs.latest_records(same_second)["default"] is same_second[0][1]
    # The pivot names its records through the owner's filter, which says what it was given.
    assert path_filters.host_pivot_record_name("b", 300.0, True) == "19700101T000500Z-b-rolled-back.json"
    with pytest.raises(AnsibleFilterError, match="host_pivot_record_name"):
        path_filters.host_pivot_record_name("b", None)
