"""A role's defaults and vars rendered with Ansible's own Templar, as a play would: for the unit tests of logic that
lives in roles/*/vars/ (nvidia_driver's plan, vllm_install's installer arguments)."""
from __future__ import annotations

import pathlib

import yaml

from ansible.parsing.dataloader import DataLoader
from ansible.template import Templar, trust_as_template

ROLES = pathlib.Path(__file__).resolve().parents[3] / "roles"


def trusted(value):
    """Values as a play's variables are: strings are templates."""
    if isinstance(value, str):
        return trust_as_template(value)
    if isinstance(value, list):
        return [trusted(v) for v in value]
    if isinstance(value, dict):
        return {k: trusted(v) for k, v in value.items()}
    return value


def role_variables(role):
    """The role's defaults, then its vars over them."""
    variables = {}
    for name in ("defaults", "vars"):
        variables.update(trusted(yaml.safe_load((ROLES / role / name / "main.yml").read_text(encoding="utf-8")) or {}))
    return variables


def render(variables, expr):
    return Templar(loader=DataLoader(), variables=variables).template(trust_as_template("{{ %s }}" % expr))
