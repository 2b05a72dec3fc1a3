"""Make the working tree importable as ansible_collections.llmfleet.vllm (see `make venv`), and the tests' shared
helpers in tests/ importable by their names."""
import os
import sys

REPO_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
COLLECTIONS_PATH = os.path.join(REPO_ROOT, ".ansible", "collections")
if not os.path.isdir(os.path.join(COLLECTIONS_PATH, "ansible_collections", "llmfleet", "vllm")):
    raise RuntimeError("collection link missing: run `make venv` first")
if COLLECTIONS_PATH not in sys.path:
    sys.path.insert(0, COLLECTIONS_PATH)
os.environ.setdefault("ANSIBLE_CONFIG", os.path.join(REPO_ROOT, "ansible.cfg"))
# The helpers the tests share (model_builders, installed_project) live in tests/ itself.
TESTS_DIR = os.path.dirname(os.path.abspath(__file__))
if TESTS_DIR not in sys.path:
    sys.path.insert(0, TESTS_DIR)


# Per-module wall time (setup, call and teardown of every test in it), printed after pytest's own summary so that a
# module's growth shows in every CI log (docs/testbed.md, "Where the time goes").
_MODULE_SECONDS = {}


def pytest_runtest_logreport(report):
    module = report.nodeid.split("::", 1)[0]
    _MODULE_SECONDS[module] = _MODULE_SECONDS.get(module, 0.0) + report.duration


def pytest_terminal_summary(terminalreporter):
    if not _MODULE_SECONDS:
        return
    total = sum(_MODULE_SECONDS.values()) or 1.0
    ranked = sorted(_MODULE_SECONDS.items(), key=lambda kv: -kv[1])
    terminalreporter.write_sep("=", "seconds per test module (%.1f s in all)" % total)
    for module, seconds in ranked[:25]:
        terminalreporter.write_line("%8.1f s  %5.1f %%  %s" % (seconds, 100.0 * seconds / total, module))
    if len(ranked) > 25:
        rest = sum(seconds for module, seconds in ranked[25:])
        terminalreporter.write_line("%8.1f s  %5.1f %%  the other %d modules" % (rest, 100.0 * rest / total, len(ranked) - 25))
