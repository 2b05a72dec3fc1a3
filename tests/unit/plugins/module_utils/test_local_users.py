"""module_utils/local_users.py: which accounts of a host can log in (and so reach a loopback port)."""
from __future__ import annotations

from ansible_collections.llmfleet.vllm.plugins.module_utils import local_users


def test_only_accounts_with_a_uid_of_a_person_and_a_login_shell_count():
    passwd = {
        "root": ["x", "0", "0", "root", "/root", "/bin/bash"],
        "daemon": ["x", "1", "1", "daemon", "/usr/sbin", "/usr/sbin/nologin"],
        "vllm": ["x", "999", "999", "", "/var/lib/vllm", "/usr/sbin/nologin"],
        "alice": ["x", "1000", "1000", "", "/home/alice", "/bin/bash"],
        "bob": ["x", "1001", "1001", "", "/home/bob", "/bin/zsh"],
        "locked": ["x", "1002", "1002", "", "/home/locked", "/usr/sbin/nologin"],
        "false": ["x", "1003", "1003", "", "/", "/bin/false"],
        "emptyshell": ["x", "1004", "1004", "", "/", ""],  # /bin/sh (passwd(5))
        "nobody": ["x", "65534", "65534", "", "/nonexistent", "/bin/sh"],
        "oldnologin": ["x", "1005", "1005", "", "/", "/sbin/nologin"],
        "broken": ["x", "not-a-uid", "1", "", "/", "/bin/sh"],
        "short": ["x", "1006"],  # no shell field: /bin/sh too (refusing is the safe side)
    }
    assert local_users.login_users(passwd) == ["alice", "bob", "emptyshell", "short"]


def test_no_accounts_no_users():
    assert local_users.login_users({}) == [] and local_users.login_users(None) == []
