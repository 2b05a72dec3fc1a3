# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
"""GPU power, memory and utilization for node_exporter's textfile collector, read with NVML (nvidia-ml-py): what the
dashboards' GPU panels draw. On a GPU host a systemd timer runs this file every 15 s (roles/observability, entry point
gpu_metrics) with the vLLM venv's Python, which has pynvml:

    python3 gpu_textfile.py --textfile-dir DIR        # writes DIR/llmfleet-gpu.prom, atomically
    python3 -S gpu_textfile.py --path /opt/vllm/lib/python3.12/site-packages --stdout

Standard library and pynvml only: on the host it runs as a plain file beside atomic_write.py and prom_text.py. The timer
runs the second form, as a user of its own: -S and --path naming the folder that holds pynvml, so that no .pth file of
the venv runs (the venv's site would run them, -I or not), and the text on stdout, into a file systemd opened for it
(the user owns no path node_exporter reads)."""
from __future__ import annotations

import argparse
import sys

try:
    from ansible_collections.llmfleet.vllm.plugins.module_utils.atomic_write import atomic_write
    from ansible_collections.llmfleet.vllm.plugins.module_utils.prom_text import Families
except ImportError:  # the plain files on a GPU host
    from atomic_write import atomic_write  # type: ignore[no-redef]
    from prom_text import Families  # type: ignore[no-redef]

FILE_NAME = 'llmfleet-gpu.prom'


def _text(value):
    return value.decode() if isinstance(value, bytes) else str(value)


def read(nvml):
    """Each GPU's index, uuid, name, power draw and limit (W), memory used and total (bytes), utilization (0..1)."""
    gpus = []
    for index in range(nvml.nvmlDeviceGetCount()):
        handle = nvml.nvmlDeviceGetHandleByIndex(index)
        memory = nvml.nvmlDeviceGetMemoryInfo(handle)
        utilization = nvml.nvmlDeviceGetUtilizationRates(handle)
        gpus.append({'index': index, 'uuid': _text(nvml.nvmlDeviceGetUUID(handle)),
                     'name': _text(nvml.nvmlDeviceGetName(handle)),
                     'power_w': nvml.nvmlDeviceGetPowerUsage(handle) / 1000.0,
                     'power_limit_w': nvml.nvmlDeviceGetEnforcedPowerLimit(handle) / 1000.0,
                     'memory_used_bytes': memory.used, 'memory_total_bytes': memory.total,
                     'utilization': utilization.gpu / 100.0})
    return gpus


def render(gpus):
    families = Families()
    for gpu in gpus:
        labels = {'gpu': str(gpu['index']), 'uuid': gpu['uuid'], 'name': gpu['name']}
        families.add('llmfleet_gpu_power_watts', 'Power the GPU draws (NVML), in watts.', labels, gpu['power_w'])
        families.add('llmfleet_gpu_power_limit_watts', 'The GPU\'s enforced power limit, in watts.', labels,
                     gpu['power_limit_w'])
        families.add('llmfleet_gpu_memory_used_bytes', 'GPU memory in use, in bytes.', labels, gpu['memory_used_bytes'])
        families.add('llmfleet_gpu_memory_total_bytes', 'GPU memory, in bytes.', labels, gpu['memory_total_bytes'])
        families.add('llmfleet_gpu_utilization_ratio', 'Share of the last sample period a kernel ran on the GPU (0..1).',
                     labels, gpu['utilization'])
    return families.text()


def main(argv=None, nvml=None):
    parser = argparse.ArgumentParser(description='Write the GPUs\' NVML readings for node_exporter\'s textfile collector.')
    where = parser.add_mutually_exclusive_group(required=True)
    where.add_argument('--textfile-dir')
    where.add_argument('--stdout', action='store_true', help='write the text to stdout (a file the caller opened)')
    parser.add_argument('--path', action='append', default=[],
                        help="a folder to import pynvml from (the venv's site-packages, for a Python run with -S)")
    args = parser.parse_args(argv)
    sys.path.extend(args.path)  # after the standard library: a folder of the venv shadows none of it
    if nvml is None:
        import pynvml as nvml  # pylint: disable=import-outside-toplevel
    nvml.nvmlInit()
    try:
        text = render(read(nvml))
    finally:
        nvml.nvmlShutdown()
    if args.stdout:
        sys.stdout.write(text)
    else:
        atomic_write(args.textfile_dir.rstrip('/') + '/' + FILE_NAME, text, mode=0o644, make_dirs=False)
    return 0


if __name__ == '__main__':
    raise SystemExit(main())
