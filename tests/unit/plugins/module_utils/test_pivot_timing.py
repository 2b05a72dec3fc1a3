"""A pivot's downtime as its record states it (module_utils/pivot_timing.py, filter pivot_downtime; issue #29 moved it
out of roles/pivot/vars/)."""
from __future__ import annotations

import pytest

from ansible_collections.llmfleet.vllm.plugins.filter.pivot_timing import pivot_downtime

JOURNAL = {"stopping_monotonic_s": 1000.0, "now_at": 1_800_000_100.0, "now_monotonic_s": 1100.0}


def test_nothing_served_before_has_no_downtime():
    assert pivot_downtime("", "new", JOURNAL, 1080.0, 5.0, 1.0) == {"source": "none", "downtime_s": None, "stopped_at": None}


def test_blue_green_has_none_whatever_the_clocks_say():
    assert pivot_downtime("a", "blue_green", JOURNAL, 1080.0) == {"source": "blue_green", "downtime_s": 0.0, "stopped_at": None}


def test_journal_clock_from_the_stop_to_the_first_good_health():
    # Both on the host's monotonic clock; the stop's epoch time from the journal's own now pair.
    assert pivot_downtime("a", "stop_start", JOURNAL, 1068.94, 1_800_000_099.0, 1_800_000_000.5) == {
        "source": "journal", "downtime_s": 68.9, "stopped_at": 1_800_000_000.0}


@pytest.mark.parametrize("old_stop, ready_monotonic", [
    ({"stopping_monotonic_s": None, "now_at": 1.0, "now_monotonic_s": 1.0}, 1068.9),  # the journal had no entry
    (JOURNAL, None),  # the start's monotonic reading is missing
    ({}, None),
])
def test_controller_clock_stands_in(old_stop, ready_monotonic):
    assert pivot_downtime("a", "stop_start", old_stop, ready_monotonic, "1800000070.25", "1800000000.0") == {
        "source": "controller", "downtime_s": 70.2, "stopped_at": 1_800_000_000.0}


def test_controller_clock_missing_is_no_figure_not_an_error():
    expected = {"source": "controller", "downtime_s": None, "stopped_at": None}
    assert pivot_downtime("a", "stop_start", {}, None, None, None) == expected
