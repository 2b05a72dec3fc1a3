"""docs/architecture.md names every role, every entry point of a role and every playbook of the collection, as its
section "Roles and playbooks" says: `roles/<role>`, `<role>:<entry>` and `playbooks/<file>`, each in backticks."""
import glob
import os
import re

import yaml

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
DOC = os.path.join(REPO, 'docs', 'architecture.md')


def named_in_doc():
    """Every backticked span of the page (one line each), e.g. {'roles/pivot', 'gateway:configure', ...}."""
    with open(DOC, encoding='utf-8') as handle:
        return set(re.findall(r'`([^`\n]+)`', handle.read()))


def roles():
    """The collection's roles: every directory of roles/ that has tasks/."""
    return sorted(os.path.basename(os.path.dirname(path)) for path in glob.glob(os.path.join(REPO, 'roles', '*', 'tasks')))


def entry_points(role):
    """The entry points of a role: the keys of argument_specs in its meta/argument_specs.yml (none without the file)."""
    path = os.path.join(REPO, 'roles', role, 'meta', 'argument_specs.yml')
    if not os.path.isfile(path):
        return []
    with open(path, encoding='utf-8') as handle:
        return sorted((yaml.safe_load(handle) or {}).get('argument_specs') or {})


def missing(expected):
    named = named_in_doc()
    return ', '.join('`%s`' % name for name in expected if name not in named)


def test_every_role_is_named():
    expected = ['roles/%s' % role for role in roles()]
    assert expected, 'no role found in roles/'
    assert not missing(expected), 'docs/architecture.md does not name these roles: %s' % missing(expected)


def test_every_entry_point_of_a_role_is_named():
    expected = ['%s:%s' % (role, entry) for role in roles() for entry in entry_points(role)]
    assert expected, 'no entry point found in roles/*/meta/argument_specs.yml'
    assert not missing(expected), 'docs/architecture.md does not name these entry points: %s' % missing(expected)


def test_every_playbook_is_named():
    expected = ['playbooks/%s' % os.path.basename(path) for path in sorted(glob.glob(os.path.join(REPO, 'playbooks', '*.yml')))]
    assert expected, 'no playbook found in playbooks/'
    assert not missing(expected), 'docs/architecture.md does not name these playbooks: %s' % missing(expected)
