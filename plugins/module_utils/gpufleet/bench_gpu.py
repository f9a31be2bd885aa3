"""GPU utilisation during a benchmark point: `nvidia-smi dmon` sampled and summarised."""
from __future__ import annotations

import shutil
import subprocess
import threading


# ---------------------------------------------------------------------------
# GPU utilisation during a point
# ---------------------------------------------------------------------------

def parse_dmon(text):
    """Samples from `nvidia-smi dmon` output: [{"index", "util", "mem_util", "fb_mib",
    "power_w"}...], columns found by the header (`# gpu pwr gtemp mtemp sm mem ...  fb`),
    `-` as None."""
    header, samples = None, []
    for line in (text or "").splitlines():
        parts = line.split()
        if not parts:
            continue
        if parts[0] == "#":
            parts = parts[1:]
        if line.lstrip().startswith("#"):
            if parts and parts[0].lower() == "gpu":  # the names; "# Idx W C ..." are units
                header = [p.lower() for p in parts]
            continue
        if header is None or len(parts) != len(header):
            continue
        row = dict(zip(header, parts))

        def num(key):
            try:
                return float(row[key])
            except (KeyError, ValueError):
                return None
        index = num("gpu")
        if index is None:
            continue
        samples.append({"index": int(index), "util": num("sm"), "mem_util": num("mem"),
                        "fb_mib": num("fb"), "power_w": num("pwr")})
    return samples


def summarise_gpu_samples(samples, source=None, reason=None):
    """{"sampled", "source", "reason", "devices": [{index, samples, util_mean, util_max,
    mem_util_mean, mem_util_max, fb_max_mib, power_mean_w}]} from raw samples; sampled is
    false (with the reason) when there are none. mem_util is NVML's memory utilisation
    (dmon's `mem` column): the share of the sample period device memory was being read
    or written, the memory-bandwidth figure NVML and dmon give."""
    by_index = {}
    for sample in samples or []:
        by_index.setdefault(int(sample["index"]), []).append(sample)
    if not by_index:
        return {"sampled": False, "source": source, "devices": [],
                "reason": reason or "no GPU on this host: no utilisation sampled"}

    def stat(values, fn):
        values = [v for v in values if v is not None]
        return round(fn(values), 1) if values else None
    devices = []
    for index in sorted(by_index):
        rows = by_index[index]
        devices.append({"index": index, "samples": len(rows),
                        "util_mean": stat([r.get("util") for r in rows], lambda v: sum(v) / len(v)),
                        "util_max": stat([r.get("util") for r in rows], max),
                        "mem_util_mean": stat([r.get("mem_util") for r in rows],
                                              lambda v: sum(v) / len(v)),
                        "mem_util_max": stat([r.get("mem_util") for r in rows], max),
                        "fb_max_mib": stat([r.get("fb_mib") for r in rows], max),
                        "power_mean_w": stat([r.get("power_w") for r in rows],
                                             lambda v: sum(v) / len(v))})
    return {"sampled": True, "source": source, "reason": None, "devices": devices}


# The sampler streams `nvidia-smi dmon` while a point runs (a Popen read by a thread):
# Ansible's run_command waits for the command's end, so it cannot. It lives here, not in
# the module (vllm_bench), which calls it.
class GpuSampler:
    """GPU utilisation while a point runs: NVML (nvidia-ml-py) every `interval` seconds,
    else `nvidia-smi dmon`; summary() says what was sampled, or why nothing was."""

    def __init__(self, interval=1.0):
        self.interval = interval
        self.samples, self.source, self.tried = [], None, []
        self._stop = threading.Event()
        self._thread = self._proc = None

    def start(self):
        try:
            import pynvml
            pynvml.nvmlInit()
            count = pynvml.nvmlDeviceGetCount()
            if not count:
                raise RuntimeError("NVML sees no GPU")
            self.source = "nvml"
            self._thread = threading.Thread(target=self._nvml, args=(pynvml, count), daemon=True)
            self._thread.start()
            return
        except Exception as exc:  # ImportError, NVMLError: no driver, no GPU
            self.tried.append(f"NVML: {exc or type(exc).__name__}")
        smi = shutil.which("nvidia-smi")
        if not smi:
            self.tried.append("nvidia-smi: not found")
            return
        try:
            self._proc = subprocess.Popen([smi, "dmon", "-s", "pum", "-d", str(int(self.interval))],
                                          stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        except OSError as exc:
            self.tried.append(f"nvidia-smi dmon: {exc}")
            return
        self.source = "nvidia-smi dmon"
        self._lines = []
        self._thread = threading.Thread(target=self._read, daemon=True)
        self._thread.start()

    def _nvml(self, pynvml, count):
        handles = [pynvml.nvmlDeviceGetHandleByIndex(i) for i in range(count)]
        while not self._stop.is_set():
            for index, handle in enumerate(handles):
                sample = {"index": index, "util": None, "mem_util": None, "fb_mib": None,
                          "power_w": None}
                try:
                    rates = pynvml.nvmlDeviceGetUtilizationRates(handle)
                    sample.update(util=rates.gpu, mem_util=rates.memory)
                    sample["fb_mib"] = pynvml.nvmlDeviceGetMemoryInfo(handle).used / 2**20
                    sample["power_w"] = pynvml.nvmlDeviceGetPowerUsage(handle) / 1000.0
                except Exception:  # a counter this GPU does not expose
                    pass
                self.samples.append(sample)
            self._stop.wait(self.interval)

    def _read(self):
        for line in self._proc.stdout:
            self._lines.append(line)

    def summary(self):
        self._stop.set()
        reason = None
        if self._proc is not None:
            if self._proc.poll() is None:
                self._proc.terminate()
                try:
                    self._proc.wait(timeout=5)
                except subprocess.TimeoutExpired:
                    self._proc.kill()
            if self._thread:
                self._thread.join(timeout=5)
            text = "".join(self._lines)
            self.samples = parse_dmon(text)
            if not self.samples:
                self.tried.append(f"nvidia-smi dmon: exit {self._proc.returncode}: "
                                  f"{text.strip()[-200:] or 'no output'}")
        elif self._thread:
            self._thread.join(timeout=5)
        if not self.samples:
            reason = ("no GPU on this host: no utilisation sampled"
                      + (f" ({'; '.join(self.tried)})" if self.tried else ""))
        return summarise_gpu_samples(self.samples, self.source if self.samples else None, reason)
