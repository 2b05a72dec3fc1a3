# -*- coding: utf-8 -*-
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
"""Sample GPU board power in a background thread and integrate it into energy.

    sampler = PowerSampler(interval_s=0.1)          # NVML if importable, else nvidia-smi
    with sampler:
        run_benchmark()
    summary = sampler.summary()                     # watts_mean, watts_max, joules, ...
    energy_per_token(summary["joules"], output_tokens)

A reader is any callable returning the current draw of each sampled GPU in watts (a list of
floats). Samples are (monotonic time, [watts...]); energy is the trapezoidal integral of the
summed power over time. With NVML, the GPUs' own energy counters
(nvmlDeviceGetTotalEnergyConsumption, Volta and newer) are read at start and stop as a
cross-check (``joules_counter``).

Standard library only; pynvml is imported lazily.
"""

from __future__ import annotations

import subprocess
import threading
import time


class PowerReadError(Exception):
    """No reader could be set up, or a reading failed."""


def trapezoid_joules(samples):
    """Energy in joules of [(t_seconds, watts), ...] (sorted by time) by the trapezoidal rule."""
    joules = 0.0
    for (t0, w0), (t1, w1) in zip(samples, samples[1:]):
        joules += (t1 - t0) * (w0 + w1) / 2.0
    return joules


def energy_per_token(joules, output_tokens):
    """Joules per generated (output) token. Raises ValueError for a non-positive token count."""
    if output_tokens is None or output_tokens <= 0:
        raise ValueError("output_tokens must be > 0, got %r" % (output_tokens,))
    return float(joules) / float(output_tokens)


class NvmlPowerReader(object):
    """Reads nvmlDeviceGetPowerUsage (milliwatts) of the given GPU indices (all when None)."""

    source = "nvml"

    def __init__(self, indices=None, nvml=None):
        if nvml is None:
            try:
                import pynvml as nvml  # pylint: disable=import-outside-toplevel
            except ImportError:
                raise PowerReadError("pynvml (nvidia-ml-py) is not importable")
        self.nvml = nvml
        try:
            nvml.nvmlInit()
        except nvml.NVMLError as exc:
            raise PowerReadError("NVML init failed: %s" % exc)
        if indices is None:
            indices = range(nvml.nvmlDeviceGetCount())
        self.indices = list(indices)
        self.handles = [nvml.nvmlDeviceGetHandleByIndex(i) for i in self.indices]

    def __call__(self):
        return [self.nvml.nvmlDeviceGetPowerUsage(h) / 1000.0 for h in self.handles]

    def energy_counters_mj(self):
        """Per-GPU total energy since driver load in millijoules, None where unsupported."""
        values = []
        for handle in self.handles:
            try:
                values.append(self.nvml.nvmlDeviceGetTotalEnergyConsumption(handle))
            except self.nvml.NVMLError:
                values.append(None)
        return values

    def close(self):
        try:
            self.nvml.nvmlShutdown()
        except self.nvml.NVMLError:
            pass


class NvidiaSmiPowerReader(object):
    """Runs ``nvidia-smi --query-gpu=power.draw`` for each sample (tens of ms per call)."""

    source = "nvidia-smi"

    def __init__(self, indices=None, nvidia_smi="nvidia-smi", runner=None):
        self.indices = None if indices is None else list(indices)
        self.nvidia_smi = nvidia_smi
        self.runner = runner or self._run
        self.__call__()  # fail now, not in the thread, when nvidia-smi is missing or broken

    def _run(self, args):
        proc = subprocess.run(args, stdout=subprocess.PIPE, stderr=subprocess.PIPE, check=False, timeout=10)
        return proc.returncode, proc.stdout.decode("utf-8", "replace"), proc.stderr.decode("utf-8", "replace")

    def __call__(self):
        args = [self.nvidia_smi, "--query-gpu=power.draw", "--format=csv,noheader,nounits"]
        if self.indices is not None:
            args.append("--id=" + ",".join(str(i) for i in self.indices))
        try:
            rc, out, err = self.runner(args)
        except (OSError, subprocess.SubprocessError) as exc:
            raise PowerReadError("nvidia-smi: %s" % exc)
        if rc != 0:
            raise PowerReadError("nvidia-smi rc=%s: %s" % (rc, (err or out).strip()))
        values = []
        for line in out.splitlines():
            line = line.strip()
            if not line:
                continue
            try:
                values.append(float(line))
            except ValueError:
                raise PowerReadError("nvidia-smi power.draw: unparsable %r" % line)
        if not values:
            raise PowerReadError("nvidia-smi power.draw: no values")
        return values

    def energy_counters_mj(self):
        return [None] * len(self.indices or [])

    def close(self):
        pass


def default_reader(indices=None):
    """NVML when possible, nvidia-smi otherwise. Raises PowerReadError when neither works."""
    errors = []
    try:
        return NvmlPowerReader(indices)
    except PowerReadError as exc:
        errors.append(str(exc))
    try:
        return NvidiaSmiPowerReader(indices)
    except PowerReadError as exc:
        errors.append(str(exc))
    raise PowerReadError("; ".join(errors))


class PowerSampler(object):
    """Background sampler of GPU power.

    `reader` -- callable returning a list of watts per GPU (see module doc); default_reader()
    when None. `clock` -- monotonic seconds. Failed readings are counted in `errors` and skipped.
    """

    def __init__(self, interval_s=0.1, reader=None, indices=None, clock=time.monotonic):
        if interval_s <= 0:
            raise ValueError("interval_s must be > 0")
        self.interval_s = float(interval_s)
        self.reader = reader if reader is not None else default_reader(indices)
        self.clock = clock
        self.samples = []  # [(t, [watts per GPU])]
        self.errors = 0
        self.last_error = None
        self._stop = threading.Event()
        self._thread = None
        self._counters_start = None
        self._counters_stop = None
        self.started_at = None
        self.stopped_at = None

    def _counters(self):
        getter = getattr(self.reader, "energy_counters_mj", None)
        if getter is None:
            return None
        try:
            return getter()
        except Exception:  # pylint: disable=broad-except
            return None

    def _sample_once(self):
        try:
            watts = list(self.reader())
        except Exception as exc:  # pylint: disable=broad-except
            self.errors += 1
            self.last_error = str(exc)
            return
        self.samples.append((self.clock(), watts))

    def _loop(self):
        next_t = self.clock()
        while not self._stop.is_set():
            self._sample_once()
            next_t += self.interval_s
            delay = next_t - self.clock()
            if delay < 0:  # a slow reading: do not try to catch up in a burst
                next_t = self.clock()
                delay = 0
            if self._stop.wait(delay):
                break

    def start(self):
        if self._thread is not None:
            raise RuntimeError("sampler already started")
        self._counters_start = self._counters()
        self.started_at = self.clock()
        self._thread = threading.Thread(target=self._loop, name="gpu-power-sampler")
        self._thread.daemon = True
        self._thread.start()
        return self

    def stop(self):
        if self._thread is None:
            raise RuntimeError("sampler not started")
        self._stop.set()
        self._thread.join()
        self._sample_once()  # close the interval at the stop time
        self.stopped_at = self.clock()
        self._counters_stop = self._counters()
        return self.summary()

    def __enter__(self):
        return self.start()

    def __exit__(self, *exc_info):
        if self._thread is not None and not self._stop.is_set():
            self.stop()
        return False

    def summary(self):
        """watts_mean (time-weighted), watts_max, joules (trapezoid) of the summed draw, per GPU too."""
        samples = list(self.samples)
        totals = [(t, sum(w)) for t, w in samples]
        duration = totals[-1][0] - totals[0][0] if len(totals) > 1 else 0.0
        joules = trapezoid_joules(totals)
        if duration > 0:
            watts_mean = joules / duration
        elif totals:
            watts_mean = sum(w for _x, w in totals) / len(totals)
        else:
            watts_mean = None
        gpus = max((len(w) for _x, w in samples), default=0)
        per_gpu = []
        for i in range(gpus):
            series = [(t, w[i]) for t, w in samples if len(w) > i]
            gj = trapezoid_joules(series)
            per_gpu.append({
                "joules": round(gj, 3),
                "watts_mean": round(gj / duration, 2) if duration > 0 else (series[0][1] if series else None),
                "watts_max": round(max(w for _x, w in series), 2) if series else None,
            })
        counter = None
        if self._counters_start and self._counters_stop and None not in self._counters_start + self._counters_stop:
            counter = round(sum(b - a for a, b in zip(self._counters_start, self._counters_stop)) / 1000.0, 3)
        return {
            "source": getattr(self.reader, "source", "custom"),
            "samples": len(samples),
            "errors": self.errors,
            "interval_s": self.interval_s,
            "duration_s": round(duration, 3),
            "watts_mean": round(watts_mean, 2) if watts_mean is not None else None,
            "watts_max": round(max(w for _x, w in totals), 2) if totals else None,
            "joules": round(joules, 3),
            "joules_counter": counter,
            "per_gpu": per_gpu,
        }
