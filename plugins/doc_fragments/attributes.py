# -*- coding: utf-8 -*-
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
"""Shared ``attributes`` of the collection's modules.

A module extends the fragment whose ``support`` levels it has, and keeps under its own
``attributes`` only what is its own: ansible-doc merges a module's entry over the
fragment's, key by key, so a ``description`` given in the module replaces the one here.
"""

from __future__ import annotations


class ModuleDocFragment(object):

    # Check mode supported, diff mode not.
    # llmfleet.vllm.attributes
    DOCUMENTATION = r"""
options: {}
attributes:
  check_mode:
    support: full
    description: Read-only; runs the same in check mode.
  diff_mode:
    support: none
    description: Nothing to diff.
"""

    # Check mode and diff mode supported.
    # llmfleet.vllm.attributes.diff
    DIFF = r"""
options: {}
attributes:
  check_mode:
    support: full
    description: Reports what would change and changes nothing.
  diff_mode:
    support: full
    description: Returns what changes, before and after.
"""
