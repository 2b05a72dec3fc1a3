# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
"""Who else can log in on a host: the accounts that could reach a loopback port, such as a sleeping model's dev-mode
server, which vLLM guards with no key outside /v1 (docs/security.md). The one owner of what counts as a login user."""
from __future__ import annotations

# login.defs' UID_MIN on Debian and the Red Hat family: below are system accounts (vllm, llmfleet-seed, daemons).
UID_MIN = 1000
# nobody (65534) and the shells that refuse a login (an empty shell is /bin/sh: passwd(5)).
UID_NOBODY = 65534
NO_LOGIN_SHELLS = ('/bin/false', '/usr/bin/false', '/bin/true', '/usr/bin/true')


def login_users(passwd):
    """The names of the accounts with a login (uid UID_MIN..65533, a shell that is not nologin or false), sorted.

    passwd: ansible.builtin.getent's ``getent_passwd`` ({name: [password, uid, gid, gecos, home, shell]}). Accounts of a
    directory (LDAP, SSSD) that getent does not enumerate are not seen (docs/security.md)."""
    users = []
    for name, fields in (passwd or {}).items():
        fields = list(fields) + [''] * (6 - len(fields))
        try:
            uid = int(fields[1])
        except (TypeError, ValueError):
            continue
        shell = (fields[5] or '').strip()
        if UID_MIN <= uid < UID_NOBODY and shell not in NO_LOGIN_SHELLS and not shell.endswith('/nologin'):
            users.append(name)
    return sorted(users)
