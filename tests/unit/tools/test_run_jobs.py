"""tools/ci/run-jobs.sh (issue 41): the long suites' jobs on two workers, in the jobs file's order; a failed, lost or malformed
job fails the run, and a molecule scenario without a job is named."""
from __future__ import annotations

import os
import shutil
import subprocess

import pytest

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))


@pytest.fixture(name="repo")
def fixture_repo(tmp_path):
    (tmp_path / "tools" / "ci").mkdir(parents=True)
    shutil.copy(os.path.join(REPO, "tools", "ci", "run-jobs.sh"), tmp_path / "tools" / "ci")
    for scenario in ("x", "_shared", "default"):
        (tmp_path / "molecule" / scenario).mkdir(parents=True)
    return tmp_path


def _run(repo, jobs, limit_s=30):
    (repo / "jobs.tsv").write_text(jobs)
    return subprocess.run([str(repo / "tools" / "ci" / "run-jobs.sh"), "2", str(limit_s)], capture_output=True, text=True,
                          env=dict(os.environ, LLMFLEET_JOBS=str(repo / "jobs.tsv")), check=False)


def _table(repo):
    return [line.split("\t") for line in (repo / "tests" / "output" / "logs" / "jobs.tsv").read_text().splitlines()]


def test_the_jobs_start_in_the_files_order_and_the_next_free_worker_takes_the_next(repo):
    result = _run(repo, "# a comment\nmolecule-x\t9\tsleep 2; echo x\nlong\t8\tsleep 2\nmid\t5\tsleep 1\nshort\t1\techo s\n")
    assert result.returncode == 0, result.stdout + result.stderr
    rows = {name: (rc, int(started)) for name, rc, _secs, started, _ended in _table(repo)}
    assert set(rows) == {"short", "molecule-x", "mid", "long"} and {rc for rc, _t in rows.values()} == {"0"}
    # Started in whole seconds: the first two together (within a tick), the others once a worker was free.
    assert abs(rows["molecule-x"][1] - rows["long"][1]) <= 1
    assert max(rows["molecule-x"][1], rows["long"][1]) < rows["mid"][1] <= rows["short"][1]
    assert (repo / "tests" / "output" / "logs" / "molecule-x.log").read_text() == "x\n"


def test_a_failed_job_fails_the_run_after_the_others_ran(repo):
    result = _run(repo, "molecule-x\t2\ttrue\nbad\t4\tfalse\nlater\t1\ttrue\n")
    assert result.returncode == 1 and sorted(r[0] for r in _table(repo)) == ["bad", "later", "molecule-x"]


def test_a_job_past_the_limit_is_stopped_and_fails(repo):
    result = _run(repo, "molecule-x\t2\tsleep 30\n", limit_s=1)
    assert result.returncode == 1 and _table(repo)[0][1] == "124"


@pytest.mark.parametrize("jobs, message", [
    ("molecule-x 2 true\n", "not NAME<TAB>SECONDS<TAB>COMMAND: molecule-x 2 true"),
    ("molecule-x\t2\t\n", "not NAME<TAB>SECONDS<TAB>COMMAND"),
    ("../x\t2\ttrue\nmolecule-x\t1\ttrue\n", "not NAME<TAB>SECONDS<TAB>COMMAND: ../x"),
    ("other\t2\ttrue\n", "no job molecule-x"),
    ("# only a comment\n", "no job molecule-x"),
])
def test_a_malformed_or_missing_job_fails_before_any_runs(repo, jobs, message):
    result = _run(repo, jobs)
    assert result.returncode == 2 and message in result.stdout, result.stdout + result.stderr
    assert not (repo / "tests" / "output" / "logs" / "jobs.tsv").exists() or _table(repo) == []
