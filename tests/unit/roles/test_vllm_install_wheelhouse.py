# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
"""vllm_install from a local wheelhouse (issue 28): the installer arguments the role computes, rendered from its real
defaults/main.yml and vars/main.yml with ansible's Templar (the same Jinja the role runs), and the documented options.
The install itself ran on the H200 systemd host (tests/unit/recordings/test_gpu_systemd_h200.py reads that record)."""
from __future__ import annotations

import pathlib

import pytest
import yaml

from role_vars import render as render_vars
from role_vars import role_variables, trusted

ROLE = pathlib.Path(__file__).resolve().parents[3] / "roles" / "vllm_install"


def render(expr, **overrides):
    variables = role_variables("vllm_install")
    variables.update(trusted(overrides))
    return render_vars(variables, expr)


def test_without_a_wheelhouse_the_indexes_are_used():
    assert render("vllm_install_installer_args") == []
    assert render("vllm_install_installer_args", vllm_install_engine="cpu") == [
        "--extra-index-url=https://download.pytorch.org/whl/cpu"]
    assert render("vllm_install_installer_args", vllm_install_find_links=["/w"],
                  vllm_install_extra_index_urls=["https://idx"]) == ["--find-links=/w", "--extra-index-url=https://idx"]


def test_a_wheelhouse_is_the_only_source():
    assert render("vllm_install_installer_args", vllm_install_wheelhouse="/srv/wheels") == [
        "--no-index", "--find-links=/srv/wheels"]


@pytest.mark.parametrize("engine", ["cuda", "cpu"])
def test_a_wheelhouse_drops_every_index(engine):
    args = render("vllm_install_installer_args", vllm_install_engine=engine, vllm_install_wheelhouse="/srv/wheels",
                  vllm_install_extra_index_urls=["https://nightly"], vllm_install_find_links=["/more"])
    assert args == ["--no-index", "--find-links=/srv/wheels", "--find-links=/more"]
    assert not [a for a in args if "index-url" in a]


def test_wheelhouse_without_dependency_resolution_and_requirements():
    """What the H200 run used: vLLM plus a pinned list, no resolver, no index."""
    args = render("vllm_install_installer_args", vllm_install_wheelhouse="/root/carry/wheelhouse",
                  vllm_install_wheelhouse_no_deps=True,
                  vllm_install_wheelhouse_requirements="/root/carry/repo/tools/device/vllm-h200-deps.txt",
                  vllm_install_pip_extra_args=["--no-compile"])
    assert args == ["--no-index", "--find-links=/root/carry/wheelhouse", "--no-deps",
                    "--requirement=/root/carry/repo/tools/device/vllm-h200-deps.txt", "--no-compile"]


def test_options_documented_and_defaulted():
    spec = yaml.safe_load((ROLE / "meta" / "argument_specs.yml").read_text())["argument_specs"]["main"]["options"]
    defaults = yaml.safe_load((ROLE / "defaults" / "main.yml").read_text())
    for name, default in (("vllm_install_wheelhouse", ""), ("vllm_install_wheelhouse_no_deps", False),
                          ("vllm_install_wheelhouse_requirements", "")):
        assert spec[name]["default"] == default == defaults[name]
        assert spec[name]["description"]


def test_the_role_checks_the_wheelhouse_for_the_pinned_wheel():
    tasks = yaml.safe_load((ROLE / "tasks" / "main.yml").read_text())
    check = next(t for t in tasks if t["name"] == "Check the wheelhouse")
    find = check["block"][0]["ansible.builtin.find"]
    assert find["paths"] == "{{ vllm_install__wheelhouse }}"
    assert find["patterns"] == "{{ vllm_install_package | replace('-', '_') }}-{{ vllm_install_version }}-*.whl"
    assert [t["name"] for t in tasks].index("Check the wheelhouse") < [t["name"] for t in tasks].index("Install vLLM into its venv")
