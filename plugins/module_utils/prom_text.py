# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
"""Prometheus' text exposition format, as the collection's textfiles for node_exporter write it: the one owner of its
escaping and layout. Standard library only (gpu_textfile.py runs it on a GPU host as a plain file)."""
from __future__ import annotations

import math


def escape(value):
    return str(value).replace('\\', '\\\\').replace('\n', '\\n').replace('"', '\\"')


def number(value):
    """A finite float, or None (a missing figure is no sample, never a 0 that a dashboard would draw)."""
    if value is None or isinstance(value, bool):
        return None
    try:
        result = float(value)
    except (TypeError, ValueError):
        return None
    return result if math.isfinite(result) else None


class Families:
    """Metric families in the order they are first named, each with its HELP, TYPE and samples."""

    def __init__(self):
        self._families = {}

    def add(self, name, help_text, labels, value, kind='gauge'):
        value = number(value)
        family = self._families.setdefault(name, {'help': help_text, 'type': kind, 'samples': []})
        if value is not None:
            family['samples'].append((labels, value))

    def text(self):
        lines = []
        for name, family in self._families.items():
            if not family['samples']:
                continue
            lines.append('# HELP %s %s' % (name, family['help']))
            lines.append('# TYPE %s %s' % (name, family['type']))
            for labels, value in family['samples']:
                rendered = ','.join('%s="%s"' % (key, escape(val)) for key, val in labels.items())
                lines.append('%s{%s} %s' % (name, rendered, repr(value) if value != int(value) else '%d' % value))
        return '\n'.join(lines) + ('\n' if lines else '')
