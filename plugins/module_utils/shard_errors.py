# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
"""The error a model file reader raises when a file fails its check."""

from __future__ import annotations


class ShardError(Exception):
    """The file is unreadable or inconsistent; ``status`` is a shard_verify status, ``reason`` says why."""

    def __init__(self, status, reason):
        super().__init__(reason)
        self.status = status
        self.reason = reason
