# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
"""Filters over model manifests (module_utils/model_manifest.py owns the format)."""
from __future__ import annotations

from ansible_collections.llmfleet.vllm.plugins.module_utils import model_manifest as _model_manifest


def manifest_lock_problem(manifest, repo_id, commit):
    return _model_manifest.lock_problem(manifest, repo_id, commit)


class FilterModule:
    def filters(self):
        return {'manifest_lock_problem': manifest_lock_problem}
