# -*- coding: utf-8 -*-
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
"""GPU facts from NVML (nvidia-ml-py's ``pynvml``) or from parsed ``nvidia-smi`` output.

Both sources produce the same shape::

    {"source": "nvml"|"nvidia-smi"|"none", "gpu_count": N, "driver_version": "580.159.04",
     "cuda_version": "13.0", "gpus": [{index, name, uuid, memory_total_mib, memory_used_mib,
     compute_capability, power_draw_w, power_limit_w, utilization_gpu_pct, pci_bus_id,
     persistence_mode, nvlink_active_links}], "topology": {nvlink, interconnect, matrix}}

Standard library only; ``pynvml`` is passed in by the caller when it is importable.
"""

from __future__ import annotations

import csv
import re

QUERY_FIELDS = (
    "index",
    "name",
    "uuid",
    "memory.total",
    "memory.used",
    "compute_cap",
    "power.draw",
    "power.limit",
    "utilization.gpu",
    "pci.bus_id",
    "persistence_mode",
    "driver_version",
)
# drivers older than ~510 do not know compute_cap
QUERY_FIELDS_LEGACY = tuple(f for f in QUERY_FIELDS if f != "compute_cap")

_NA = ("", "[n/a]", "n/a", "[not supported]", "not supported", "[unknown error]", "[insufficient permissions]")
_ANSI = re.compile(r"\x1b\[[0-9;]*[A-Za-z]")
_CUDA_VERSION = re.compile(r"CUDA Version\s*:\s*([0-9]+(?:\.[0-9]+)*)")
_NVLINK_CELL = re.compile(r"^NV([0-9]+)$")
_GPU_LABEL = re.compile(r"^GPU([0-9]+)$")


class NvidiaError(Exception):
    """A source could not produce facts (the message says why)."""


def empty_facts(source="none"):
    return {
        "source": source,
        "gpu_count": 0,
        "driver_version": None,
        "cuda_version": None,
        "gpus": [],
        "topology": {"nvlink": False, "interconnect": "none", "matrix": {}},
    }


def _value(raw):
    raw = raw.strip()
    if raw.lower() in _NA:
        return None
    return raw


def _to_int(raw):
    value = _value(raw)
    if value is None:
        return None
    try:
        return int(float(value))
    except ValueError:
        return None


def _to_float(raw):
    value = _value(raw)
    if value is None:
        return None
    try:
        return round(float(value), 2)
    except ValueError:
        return None


def _persistence(raw):
    value = _value(raw)
    if value is None:
        return None
    return value.lower() in ("enabled", "1", "on", "true")


def normalize_bus_id(bus_id):
    """NVML and nvidia-smi print 8 hex digits of PCI domain ('00000000:19:00.0'); keep that form, upper-case."""
    if bus_id is None:
        return None
    if isinstance(bus_id, bytes):
        bus_id = bus_id.decode("ascii", "replace")
    bus_id = bus_id.strip().rstrip("\x00")
    return bus_id.upper() if bus_id else None


def parse_query_csv(text, fields=QUERY_FIELDS):
    """Parse ``nvidia-smi --query-gpu=<fields> --format=csv,noheader,nounits`` output.

    Returns (gpus, driver_version)."""
    gpus = []
    driver = None
    for row in csv.reader(text.splitlines(), skipinitialspace=True):
        if not row or not "".join(row).strip():
            continue
        if len(row) != len(fields):
            raise NvidiaError("nvidia-smi query: expected %d fields, got %d in %r" % (len(fields), len(row), row))
        raw = dict(zip(fields, row))
        gpu = {
            "index": _to_int(raw["index"]),
            "name": _value(raw["name"]),
            "uuid": _value(raw["uuid"]),
            "memory_total_mib": _to_int(raw["memory.total"]),
            "memory_used_mib": _to_int(raw["memory.used"]),
            "compute_capability": _value(raw["compute_cap"]) if "compute_cap" in raw else None,
            "power_draw_w": _to_float(raw["power.draw"]),
            "power_limit_w": _to_float(raw["power.limit"]),
            "utilization_gpu_pct": _to_int(raw["utilization.gpu"]),
            "pci_bus_id": normalize_bus_id(_value(raw["pci.bus_id"])),
            "persistence_mode": _persistence(raw["persistence_mode"]),
            "nvlink_active_links": None,
        }
        driver = driver or _value(raw["driver_version"])
        gpus.append(gpu)
    gpus.sort(key=lambda g: g["index"] if g["index"] is not None else -1)
    return gpus, driver


def parse_cuda_version(text):
    """CUDA version (the driver's) from plain ``nvidia-smi`` or ``nvidia-smi -q`` output."""
    match = _CUDA_VERSION.search(text or "")
    return match.group(1) if match else None


def parse_topo_matrix(text):
    """Parse ``nvidia-smi topo -m``.

    Returns {"matrix": {"GPU0": {"GPU1": "NV18", ...}, ...}, "nvlink": bool, "gpus": N} where the
    matrix keeps only GPU-to-GPU cells (X on the diagonal is dropped). ``nvlink`` is true when any
    cell is NV<n> (n bonded NVLinks); other cells (SYS, NODE, PHB, PXB, PIX) are PCIe paths.
    """
    header = None
    matrix = {}
    for line in (text or "").splitlines():
        line = _ANSI.sub("", line).rstrip()
        if not line.strip():
            if matrix:
                break  # the legend follows the matrix after a blank line
            continue
        cells = [c.strip() for c in line.split("\t")]
        if header is None:
            if "GPU0" in cells and not _GPU_LABEL.match(cells[0]):
                header = cells
            continue
        if not _GPU_LABEL.match(cells[0]):
            continue
        row = {}
        for col, cell in zip(header[1:], cells[1:]):
            if _GPU_LABEL.match(col) and col != cells[0]:
                row[col] = cell
        matrix[cells[0]] = row
    if header is None:
        raise NvidiaError("nvidia-smi topo -m: no GPU header line found")
    nvlink = any(_NVLINK_CELL.match(c) for row in matrix.values() for c in row.values())
    return {"matrix": matrix, "nvlink": nvlink, "gpus": len(matrix)}


def interconnect(gpu_count, nvlink):
    if gpu_count == 0:
        return "none"
    if gpu_count == 1:
        return "single"
    return "nvlink" if nvlink else "pcie"


def facts_from_nvidia_smi(run):
    """Gather facts by running nvidia-smi through `run(args) -> (rc, stdout, stderr)`.

    `args` excludes the nvidia-smi executable itself. Raises NvidiaError when nvidia-smi fails
    (e.g. no driver loaded)."""
    fields = QUERY_FIELDS
    rc, out, err = run(["--query-gpu=" + ",".join(fields), "--format=csv,noheader,nounits"])
    if rc != 0 and "not a valid field" in (out + err):
        fields = QUERY_FIELDS_LEGACY
        rc, out, err = run(["--query-gpu=" + ",".join(fields), "--format=csv,noheader,nounits"])
    if rc != 0:
        raise NvidiaError("nvidia-smi query failed (rc=%s): %s" % (rc, (err or out).strip()))
    gpus, driver = parse_query_csv(out, fields)
    facts = empty_facts("nvidia-smi")
    facts["gpus"] = gpus
    facts["gpu_count"] = len(gpus)
    facts["driver_version"] = driver
    rc, out, err = run([])
    if rc == 0:
        facts["cuda_version"] = parse_cuda_version(out)
    return facts


def topology_from_nvidia_smi(run):
    rc, out, err = run(["topo", "-m"])
    if rc != 0:
        raise NvidiaError("nvidia-smi topo -m failed (rc=%s): %s" % (rc, (err or out).strip()))
    return parse_topo_matrix(out)


def _text(value):
    if isinstance(value, bytes):
        return value.decode("utf-8", "replace")
    return value


def _call(nvml, name, *args):
    """Call nvml.<name>(*args); None when the GPU/driver does not support it (any NVMLError)."""
    func = getattr(nvml, name, None)
    if func is None:
        return None
    try:
        return func(*args)
    except nvml.NVMLError:
        return None


def _cuda_version_from_int(version):
    if not version:
        return None
    return "%d.%d" % (version // 1000, (version % 1000) // 10)


def nvlink_active_links(nvml, handle):
    """Number of NVLinks in state enabled; 0 when the GPU has none or reports NotSupported."""
    max_links = getattr(nvml, "NVML_NVLINK_MAX_LINKS", 18)
    enabled = getattr(nvml, "NVML_FEATURE_ENABLED", 1)
    active = 0
    for link in range(max_links):
        try:
            state = nvml.nvmlDeviceGetNvLinkState(handle, link)
        except nvml.NVMLError:
            # NotSupported / InvalidArgument past the last link of this GPU
            continue
        if state == enabled:
            active += 1
    return active


def facts_from_nvml(nvml):
    """Gather facts through an imported ``pynvml`` module (or anything with its interface).

    Raises NvidiaError when NVML cannot be initialised (no library, no driver)."""
    try:
        nvml.nvmlInit()
    except nvml.NVMLError as exc:
        raise NvidiaError("NVML init failed: %s" % exc)
    try:
        facts = empty_facts("nvml")
        facts["driver_version"] = _text(_call(nvml, "nvmlSystemGetDriverVersion"))
        cuda = _call(nvml, "nvmlSystemGetCudaDriverVersion_v2")
        if cuda is None:
            cuda = _call(nvml, "nvmlSystemGetCudaDriverVersion")
        facts["cuda_version"] = _cuda_version_from_int(cuda)
        try:
            count = nvml.nvmlDeviceGetCount()
        except nvml.NVMLError as exc:
            raise NvidiaError("NVML device count failed: %s" % exc)
        for index in range(count):
            handle = nvml.nvmlDeviceGetHandleByIndex(index)
            memory = _call(nvml, "nvmlDeviceGetMemoryInfo", handle)
            capability = _call(nvml, "nvmlDeviceGetCudaComputeCapability", handle)
            power = _call(nvml, "nvmlDeviceGetPowerUsage", handle)
            limit = _call(nvml, "nvmlDeviceGetEnforcedPowerLimit", handle)
            if limit is None:
                limit = _call(nvml, "nvmlDeviceGetPowerManagementLimit", handle)
            util = _call(nvml, "nvmlDeviceGetUtilizationRates", handle)
            pci = _call(nvml, "nvmlDeviceGetPciInfo", handle)
            persistence = _call(nvml, "nvmlDeviceGetPersistenceMode", handle)
            facts["gpus"].append({
                "index": index,
                "name": _text(_call(nvml, "nvmlDeviceGetName", handle)),
                "uuid": _text(_call(nvml, "nvmlDeviceGetUUID", handle)),
                "memory_total_mib": memory.total // (1024 * 1024) if memory is not None else None,
                "memory_used_mib": memory.used // (1024 * 1024) if memory is not None else None,
                "compute_capability": "%d.%d" % tuple(capability) if capability else None,
                "power_draw_w": round(power / 1000.0, 2) if power is not None else None,
                "power_limit_w": round(limit / 1000.0, 2) if limit is not None else None,
                "utilization_gpu_pct": util.gpu if util is not None else None,
                "pci_bus_id": normalize_bus_id(pci.busId) if pci is not None else None,
                "persistence_mode": bool(persistence) if persistence is not None else None,
                "nvlink_active_links": nvlink_active_links(nvml, handle),
            })
        facts["gpu_count"] = count
        nvlink = any(g["nvlink_active_links"] for g in facts["gpus"])
        facts["topology"] = {"nvlink": nvlink, "interconnect": interconnect(count, nvlink), "matrix": {}}
        return facts
    finally:
        try:
            nvml.nvmlShutdown()
        except nvml.NVMLError:
            pass


def gather(nvml=None, smi_run=None, source="auto", include_topology=True):
    """Facts from the preferred source, falling back: nvml -> nvidia-smi -> none.

    `nvml` is the imported pynvml module or None; `smi_run` runs nvidia-smi (see
    facts_from_nvidia_smi) or is None when nvidia-smi is not installed. Returns (facts, errors)
    where errors lists why a source was skipped. A host without GPUs is not an error.
    """
    errors = []
    order = {"auto": ("nvml", "nvidia-smi"), "nvml": ("nvml",), "nvidia-smi": ("nvidia-smi",)}[source]
    facts = None
    for name in order:
        if name == "nvml":
            if nvml is None:
                errors.append("nvml: python module pynvml (nvidia-ml-py) not importable")
                continue
            try:
                facts = facts_from_nvml(nvml)
                break
            except NvidiaError as exc:
                errors.append("nvml: %s" % exc)
        else:
            if smi_run is None:
                errors.append("nvidia-smi: not found in PATH")
                continue
            try:
                facts = facts_from_nvidia_smi(smi_run)
                break
            except NvidiaError as exc:
                errors.append("nvidia-smi: %s" % exc)
    if facts is None:
        return empty_facts("none"), errors
    if facts["source"] == "nvidia-smi" and facts["gpu_count"] > 0:
        facts["topology"]["interconnect"] = "single" if facts["gpu_count"] == 1 else "unknown"
    if include_topology and smi_run is not None and facts["gpu_count"] > 0:
        try:
            topo = topology_from_nvidia_smi(smi_run)
            facts["topology"]["matrix"] = topo["matrix"]
            nvlink = facts["topology"]["nvlink"] or topo["nvlink"]
            facts["topology"]["nvlink"] = nvlink
            facts["topology"]["interconnect"] = interconnect(facts["gpu_count"], nvlink)
        except NvidiaError as exc:
            errors.append("topology: %s" % exc)
    return facts, errors
