# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
"""The JSON object a script run by ansible.builtin.script printed last."""
from __future__ import annotations

import json

from ansible.errors import AnsibleFilterError


def script_json(stdout, default=None):
    """Parse the last line of stdout that is a JSON object.

    ansible.builtin.script runs under a terminal, so its stdout also carries what the host writes to terminals
    (journald's wall broadcast of an emergency message, for one) around what the script printed.
    """
    for line in reversed(str(stdout or '').splitlines()):
        line = line.strip()
        if line.startswith('{'):
            try:
                return json.loads(line)
            except ValueError:
                continue
    if default is not None:
        return default
    raise AnsibleFilterError('script_json: no JSON object in the script output %r' % (str(stdout)[-400:],))


class FilterModule:
    def filters(self):
        return {'script_json': script_json}
