# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
"""The metric contract: the metrics the collection's dashboards and alert rules use (roles/observability/files/
metric-contract.json, built from their PromQL by tools/observability/build.py), checked against what an engine
exports. A vLLM upgrade that renames or drops a metric fails the check, naming each panel and rule that would go
empty, instead of a dashboard going blank in silence."""
from __future__ import annotations

import re

_SAMPLE_NAME_RE = re.compile(r'^([a-zA-Z_:][a-zA-Z0-9_:]*)(?:\{|\s)')


def exported_metrics(text):
    """The names of the samples in a Prometheus text exposition (a histogram's _bucket, _sum and _count each)."""
    names = set()
    for line in (text or '').splitlines():
        if not line or line.startswith('#'):
            continue
        match = _SAMPLE_NAME_RE.match(line)
        if match:
            names.add(match.group(1))
    return names


def contract_entries(contract, extra=None):
    """The contract's entries ({metric, source, used_by}) and the user's own (for their dashboards), checked."""
    entries = list((contract or {}).get('metrics', []) if isinstance(contract, dict) else contract or [])
    for index, entry in enumerate(extra or []):
        if not isinstance(entry, dict) or not entry.get('metric') or not isinstance(entry.get('used_by', []), list):
            raise ValueError('observability_contract_extra[%d] must be {metric, source (default vllm), used_by: [names]},'
                             ' got %r' % (index, entry))
        entries.append({'metric': entry['metric'], 'source': entry.get('source', 'vllm'),
                        'used_by': entry.get('used_by') or ['observability_contract_extra']})
    return entries


def missing_metrics(entries, exported, sources=('vllm',)):
    """The entries of these sources whose metric is not exported, in the contract's order."""
    return [entry for entry in entries if entry.get('source') in sources and entry['metric'] not in exported]


def message(missing, where):
    """One line per missing metric, naming who uses it."""
    lines = ['%s does not export %d metric(s) that dashboards or alert rules use:' % (where, len(missing))]
    for entry in missing:
        lines.append('- %s, used by %s' % (entry['metric'], '; '.join(entry.get('used_by') or ['?'])))
    return '\n'.join(lines)
