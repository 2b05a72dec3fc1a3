# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
"""A model name as the directory of its benchmark records."""
from __future__ import annotations

from ansible.errors import AnsibleFilterError

from ansible_collections.llmfleet.vllm.plugins.module_utils.bench_report import ReportError, slug


def record_slug(model):
    try:
        return slug(model)
    except ReportError as exc:
        raise AnsibleFilterError('record_slug: %s' % exc)


class FilterModule:
    def filters(self):
        return {'record_slug': record_slug}
