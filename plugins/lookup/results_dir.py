# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
"""Where the controller keeps records, reports and locks: a folder of the user's project, never of the collection."""
from __future__ import annotations

DOCUMENTATION = r"""
name: results_dir
author:
  - llmfleet maintainers (@llmfleet)
short_description: The controller folder for pivot records, benchmark results, reports and rollout locks
description:
  - Returns C(llmfleet_results_dir) when it is set (a relative path is taken from the current directory).
  - Otherwise C(results/) beside the C(ansible.cfg) in use (the user's project), else in the current directory.
  - Never a folder inside the collection, wherever it is installed.
  - The default of C(pivot_controller_results_dir), C(benchmark_controller_results_dir) and rollout.yml's results.
options: {}
"""

EXAMPLES = r"""
- name: Show where this project keeps its results
  ansible.builtin.debug:
    msg: "{{ lookup('llmfleet.vllm.results_dir') }}"
"""

RETURN = r"""
_raw:
  description: The absolute path of the results folder (one element).
  type: list
  elements: path
"""

import os

from ansible.plugins.lookup import LookupBase


def results_dir(variables, cwd=None):
    """The results folder for these play variables."""
    cwd = cwd or os.getcwd()
    chosen = (variables or {}).get('llmfleet_results_dir') or ''
    if chosen:
        return os.path.normpath(os.path.join(cwd, os.path.expanduser(str(chosen))))
    config = (variables or {}).get('ansible_config_file') or ''
    base = os.path.dirname(os.path.abspath(str(config))) if config else cwd
    return os.path.join(base, 'results')


class LookupModule(LookupBase):
    def run(self, terms, variables=None, **kwargs):
        if variables is not None and 'llmfleet_results_dir' in variables:
            variables = dict(variables, llmfleet_results_dir=self._templar.template(variables['llmfleet_results_dir']))
        return [results_dir(variables)]
