# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
"""Record every NVML call that module_utils.nvidia.facts_from_nvml makes, with its real result.

Run on a GPU host:  python3 tools/device/nvml_record.py OUT.json
The JSON ({"calls": {key: result}, "facts": {...}, "pynvml_version": ...}) is replayed by
tests/unit/plugins/modules/test_gpu_facts.py, so the NVML code path is tested against a real GPU's answers.
"""
from __future__ import annotations

import ctypes
import json
import sys

import pynvml

from ansible_collections.llmfleet.vllm.plugins.module_utils import nvidia


def plain(value):
    if isinstance(value, bytes):
        return value.decode("utf-8", "replace")
    if isinstance(value, (list, tuple)):
        return [plain(v) for v in value]
    if isinstance(value, ctypes.Structure):
        return {"__struct__": type(value).__name__,
                **{f[0]: plain(getattr(value, f[0])) for f in value._fields_}}
    if isinstance(value, ctypes.Array):
        return [plain(v) for v in value]
    return value


class Recorder(object):
    def __init__(self):
        self.calls = {}
        self.handles = {}

    def __getattr__(self, name):
        attr = getattr(pynvml, name)
        if not (callable(attr) and name.startswith("nvml")):
            return attr

        def wrapped(*args):
            key_args = [self.handles.get(id(a), a) if not isinstance(a, (int, str)) else a for a in args]
            key = "%s(%s)" % (name, ",".join(str(a) for a in key_args))
            try:
                result = attr(*args)
            except pynvml.NVMLError as exc:
                self.calls[key] = {"__error__": exc.value, "str": str(exc)}
                raise
            if name == "nvmlDeviceGetHandleByIndex":
                self.handles[id(result)] = "handle%d" % args[0]
                self._keep = getattr(self, "_keep", []) + [result]
                self.calls[key] = {"__handle__": "handle%d" % args[0]}
            else:
                self.calls[key] = plain(result)
            return result
        return wrapped


def main():
    rec = Recorder()
    facts = nvidia.facts_from_nvml(rec)
    # extra readings used by gpu_power and the docs
    pynvml.nvmlInit()
    extra = {}
    for i in range(pynvml.nvmlDeviceGetCount()):
        h = pynvml.nvmlDeviceGetHandleByIndex(i)
        for fn in ("nvmlDeviceGetTotalEnergyConsumption", "nvmlDeviceGetPowerManagementDefaultLimit",
                   "nvmlDeviceGetClockInfo"):
            try:
                extra["%s(%d)" % (fn, i)] = plain(getattr(pynvml, fn)(h) if fn != "nvmlDeviceGetClockInfo"
                                                  else getattr(pynvml, fn)(h, pynvml.NVML_CLOCK_SM))
            except pynvml.NVMLError as exc:
                extra["%s(%d)" % (fn, i)] = {"__error__": exc.value, "str": str(exc)}
    pynvml.nvmlShutdown()
    doc = {"pynvml_file": pynvml.__file__, "calls": rec.calls, "facts": facts, "extra": extra,
           "NVML_NVLINK_MAX_LINKS": pynvml.NVML_NVLINK_MAX_LINKS}
    with open(sys.argv[1], "w") as fh:
        json.dump(doc, fh, indent=1, sort_keys=True)
    print(json.dumps(facts, indent=1))


if __name__ == "__main__":
    main()
