# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
"""Filters over the collection's model catalog (catalog/models.yml) merged with the user's llmfleet_models_extra."""
from __future__ import annotations

import os

import yaml
from ansible.errors import AnsibleFilterError

from ansible_collections.llmfleet.vllm.plugins.module_utils import catalog as _catalog
from ansible_collections.llmfleet.vllm.plugins.module_utils.plain_data import plain

CATALOG_PATH = os.path.join(os.path.dirname(os.path.abspath(__file__)), '..', '..', 'catalog', 'models.yml')


def load_catalog(path=CATALOG_PATH):
    """The shipped catalog as plain python data."""
    with open(path, encoding='utf-8') as handle:
        data = yaml.safe_load(handle)
    if not isinstance(data, dict):
        raise AnsibleFilterError('%s: the catalog must be a mapping of model name to entry' % path)
    return data


def catalog_entry(name, extra=None, profile=None):
    """One validated catalog entry (defaults filled in, profile applied); fails naming the model and field."""
    try:
        return _catalog.get(load_catalog(), name, plain(extra), profile)
    except _catalog.CatalogError as exc:
        raise AnsibleFilterError(str(exc)) from exc


def catalog_models(extra=None):
    """The whole catalog with extra merged in; fails on any invalid entry."""
    errors = catalog_validate(extra)
    if errors:
        raise AnsibleFilterError('invalid model catalog:\n  ' + '\n  '.join(errors))
    return _catalog.merge(load_catalog(), plain(extra))


def gpus_needed(entry):
    """The GPUs a catalog entry's server uses (TP x PP x DP)."""
    if not isinstance(entry, dict) or not isinstance(entry.get('serving'), dict):
        raise AnsibleFilterError('gpus_needed expects a catalog entry (use llmfleet.vllm.catalog_entry), got %r' % (entry,))
    return _catalog.gpus_needed(entry)


def catalog_validate(extra=None):
    """Error messages for the catalog with extra merged in (empty list when valid)."""
    return _catalog.validate(load_catalog(), plain(extra))


class FilterModule:
    def filters(self):
        return {
            'catalog_entry': catalog_entry,
            'catalog_models': catalog_models,
            'catalog_validate': catalog_validate,
            'gpus_needed': gpus_needed,
        }
