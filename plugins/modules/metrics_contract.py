#!/usr/bin/python
# -*- coding: utf-8 -*-
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
from __future__ import annotations

DOCUMENTATION = r"""
---
module: metrics_contract
short_description: Check that an engine exports every metric the dashboards and alert rules use
version_added: "0.6.0"
description:
  - Scrapes O(url) (a vLLM server's C(/metrics)) or reads O(text), and fails when a metric of O(contract) from one of
    O(sources) is not among the samples, naming every dashboard panel and alert rule that uses it.
  - The collection's contract is C(roles/observability/files/metric-contract.json), built from the PromQL of its
    dashboards and rules; O(extra) adds the metrics of one's own dashboards.
  - Reads only; changes nothing.
author:
  - llmfleet maintainers (@llmfleet)
options:
  url:
    description: The C(/metrics) URL to scrape. One of O(url) and O(text).
    type: str
  text:
    description: A Prometheus text exposition to check instead (a recording).
    type: str
  contract:
    description: The contract - C({metrics - [{metric, source, used_by}]}) or the list itself.
    type: raw
    required: true
  extra:
    description: More entries, each C({metric, source (default vllm), used_by - [names]}).
    type: list
    elements: dict
    default: []
  sources:
    description: Which sources of the contract this scrape answers for.
    type: list
    elements: str
    default: [vllm]
  what:
    description: What is scraped, for the message (a slot, its model and engine version).
    type: str
    default: the engine
  timeout:
    description: Seconds the scrape may take.
    type: int
    default: 10
extends_documentation_fragment:
  - llmfleet.vllm.attributes
"""

EXAMPLES = r"""
- name: Check the slot's vLLM against the dashboards and rules
  llmfleet.vllm.metrics_contract:
    url: http://127.0.0.1:8000/metrics
    contract: "{{ lookup('ansible.builtin.file', 'metric-contract.json') | from_json }}"
    what: slot default (minimax-m25, vLLM 0.26.0)
"""

RETURN = r"""
checked:
  description: The metrics of O(sources) the contract names.
  returned: always
  type: list
  elements: str
missing:
  description: The entries whose metric is not exported, each C({metric, source, used_by}).
  returned: always
  type: list
  elements: dict
exported:
  description: How many distinct sample names the scrape had.
  returned: always
  type: int
"""

from ansible.module_utils.basic import AnsibleModule
from ansible.module_utils.common.text.converters import to_text
from ansible.module_utils.urls import open_url
from ansible_collections.llmfleet.vllm.plugins.module_utils import metric_contract as mc


def main():
    module = AnsibleModule(argument_spec=dict(
        url=dict(type='str'),
        text=dict(type='str'),
        contract=dict(type='raw', required=True),
        extra=dict(type='list', elements='dict', default=[]),
        sources=dict(type='list', elements='str', default=['vllm']),
        what=dict(type='str', default='the engine'),
        timeout=dict(type='int', default=10),
    ), required_one_of=[('url', 'text')], mutually_exclusive=[('url', 'text')], supports_check_mode=True)
    p = module.params
    try:
        entries = mc.contract_entries(p['contract'], p['extra'])
    except ValueError as exc:
        module.fail_json(msg=str(exc))
    text = p['text']
    if p['url']:
        try:
            text = to_text(open_url(p['url'], timeout=p['timeout']).read())
        except Exception as exc:  # pylint: disable=broad-except
            module.fail_json(msg='%s: cannot scrape %s: %s' % (p['what'], p['url'], exc))
    exported = mc.exported_metrics(text)
    checked = sorted({e['metric'] for e in entries if e.get('source') in p['sources']})
    missing = mc.missing_metrics(entries, exported, p['sources'])
    result = dict(changed=False, checked=checked, missing=missing, exported=len(exported))
    if missing:
        module.fail_json(msg=mc.message(missing, p['what']), **result)
    module.exit_json(**result)


if __name__ == '__main__':
    main()
