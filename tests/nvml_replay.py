"""The pynvml calls recorded on the real H200 (tests/fixtures/nvidia/h200-nvml.json), replayed: shared by the unit tests
of gpu_facts and gpu_power (tests/conftest.py puts tests/ on the path)."""
from __future__ import annotations

import os
import types

import pynvml

FIX = os.path.join(os.path.dirname(os.path.abspath(__file__)), "fixtures", "nvidia")


class ReplayNvml(object):
    """Test double for pynvml replaying the calls recorded on the real H200 (no GPU here).

    Unknown calls raise KeyError, so a code change that makes new NVML calls is noticed.
    `override` replaces recorded results: {call_key: value or NVMLError code via {'__error__': n}}.
    """

    NVMLError = pynvml.NVMLError

    def __init__(self, recording, override=None):
        self.calls = dict(recording["calls"])
        self.calls.update(override or {})
        self.NVML_NVLINK_MAX_LINKS = recording["NVML_NVLINK_MAX_LINKS"]
        self.NVML_FEATURE_ENABLED = pynvml.NVML_FEATURE_ENABLED
        self.made = []

    def __getattr__(self, name):
        if not name.startswith("nvml"):
            raise AttributeError(name)

        def call(*args):
            key = "%s(%s)" % (name, ",".join(str(a) for a in args))
            self.made.append(key)
            result = self.calls[key]
            if isinstance(result, dict):
                if "__error__" in result:
                    raise pynvml.NVMLError(result["__error__"])
                if "__handle__" in result:
                    return result["__handle__"]
                return types.SimpleNamespace(**result)
            if name == "nvmlDeviceGetCudaComputeCapability":
                return tuple(result)
            return result
        return call
