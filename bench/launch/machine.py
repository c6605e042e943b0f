"""The machine around a run, as the harness sees it: the load average before and after, the CPU time processes
outside the run's tree used during its timed windows, and on GPUs the other processes on its GPUs and their clocks and
throttle reasons (NVML). bench/core/trust.py judges what is measured here; this module only measures.

A sampler thread in the harness reads, every INTERVAL_S seconds:

- ``/proc/stat``: busy time (user, nice, system, irq, softirq, steal: another VM's use of our CPUs counts too) of the
  CPUs the run may use (this process's affinity mask, which the ranks inherit);
- the run's own CPU time: this process and every descendant (utime + stime + cutime + cstime from /proc/PID/stat:
  a child's time moves into its parent's cutime when reaped, so every CPU second is counted once). Descendants are
  found from the ppid in each /proc/PID/stat, one small read per process per tick; never the environments;
- on GPUs (NVML, when it loads): compute processes, SM and memory clocks, clock-event (throttle) reasons.

Others' CPU time = busy - the run's own, cumulative, so the windows' share is two interpolations, however short
the windows are. The ranks report the windows' wall-clock span (``windows_wall_span``, epoch seconds) in the record;
the harness then adds ``machine``, ``disturbed`` and ``disturbed_reasons`` to it (``attach``), replacing the file
atomically. The sampler's own CPU time is recorded (``sampler_cpu_seconds``).
"""
from __future__ import annotations

import json
import os
import socket
import threading
import time
from pathlib import Path

from bench.core import cuda, environment, nvml, trust

INTERVAL_S = 0.5
PROBE_S = 1.0  # --wait-quiet: how long each look at the machine lasts
CLK_TCK = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100


def usable_cpu_set() -> set[int]:
    try:
        return set(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        return set(range(os.cpu_count() or 1))


def cpu_busy_seconds(cpus: set[int], stat: str = "/proc/stat") -> float | None:
    """Busy seconds of ``cpus`` since boot, every process's (steal included); None without /proc/stat."""
    try:
        with open(stat) as f:
            lines = f.read().splitlines()
    except OSError:
        return None
    busy = 0
    for line in lines:
        if not line.startswith("cpu"):
            break
        name, *vals = line.split()
        if name == "cpu" or int(name[3:]) not in cpus:
            continue
        v = [int(x) for x in vals[:8]] + [0] * (8 - len(vals[:8]))
        user, nice, system, _idle, _iowait, irq, softirq, steal = v
        busy += user + nice + system + irq + softirq + steal
    return busy / CLK_TCK


def _proc_stat(pid: int | str) -> tuple[int, float] | None:
    """(ppid, CPU seconds of the process and its reaped children) from /proc/PID/stat."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            raw = f.read()
    except OSError:
        return None
    rest = raw[raw.rfind(b")") + 2:].split()
    try:
        return int(rest[1]), (int(rest[11]) + int(rest[12]) + int(rest[13]) + int(rest[14])) / CLK_TCK
    except (IndexError, ValueError):
        return None


def tree_cpu(root: int | None = None) -> tuple[float, set[int]]:
    """CPU seconds of ``root`` (default: this process) and all its descendants, and their pids."""
    root = root or os.getpid()
    table = {}
    try:
        names = os.listdir("/proc")
    except OSError:  # not Linux: no process table to read
        names = []
    for name in names:
        if name.isdigit():
            st = _proc_stat(name)
            if st:
                table[int(name)] = st
    children: dict[int, list[int]] = {}
    for pid, (ppid, _) in table.items():
        children.setdefault(ppid, []).append(pid)
    tree, todo = set(), [root]
    while todo:
        pid = todo.pop()
        if pid in tree:
            continue
        tree.add(pid)
        todo += children.get(pid, [])
    return sum(table[p][1] for p in tree if p in table), tree


# ---------------------------------------------------------------------------------------------------
# NVML, guarded: without a driver (CPU machines) every call is skipped and the reason kept.

class Gpus:
    """NVML's view of the run's GPUs, sampled by the watch (bench/core/nvml.py); ``reason`` says why there is none.
    A query one GPU does not support leaves that field None and its reason in ``unsupported``."""

    QUERIES = ("pids", "sm_mhz", "mem_mhz", "reasons")

    def __init__(self, indices: list[int]):
        self.indices, self.session, self.reason = list(indices), None, None
        self.unsupported: dict[str, str] = {}
        if not self.indices:
            return
        try:
            self.session = nvml.open()
        except nvml.Unavailable as e:  # no driver, no library
            self.indices, self.reason = [], str(e)

    def sample(self) -> list[dict]:
        out = []
        n = self.session
        if n is None:
            return out
        for index in self.indices:
            g = {"index": index}
            for key, call in zip(self.QUERIES, (n.compute_pids, lambda i: n.clock_mhz(i, "sm"),
                                                lambda i: n.clock_mhz(i, "mem"), n.clock_event_reasons)):
                try:
                    g[key] = call(index)
                except nvml.Unavailable as e:  # one query unsupported on this GPU: keep the others, and why
                    g[key] = None
                    self.unsupported.setdefault(key, str(e))
            out.append(g)
        return out

    def close(self) -> None:
        if self.session is not None:
            self.session.close()
            self.session = None


def run_gpus(device_type: str, gpus_on_node: int) -> list[int]:
    """NVML indices of the GPUs a run of ``gpus_on_node`` devices uses on this node: CUDA devices 0..n-1 as this
    process sees them (CUDA_VISIBLE_DEVICES honoured). Without NVML, the CUDA indices: the watch then says why it
    could not read them."""
    if device_type != "cuda" or gpus_on_node < 1:
        return []
    try:
        with nvml.open() as n:
            total = n.count()
    except nvml.Unavailable:
        total = cuda.count()
    return environment.visible_nvml_indices(total)[:gpus_on_node]


def other_gpu_pids(pids: list[int] | None, tree: set[int], visible=lambda p: os.path.exists(f"/proc/{p}")) -> list[int]:
    """The compute processes on one GPU that are not the run's. In a container NVML reports the host's pids, which
    this pid namespace does not show: when none of the GPU's processes is visible as the run's, one of them is taken
    to be the run's own rank (every backend holds one process per GPU) and the rest are others."""
    pids = list(pids or [])
    ours = [p for p in pids if p in tree]
    unseen = [p for p in pids if p not in tree and not visible(p)]
    others = [p for p in pids if p not in tree and visible(p)]
    return others + (unseen if ours else unseen[1:])


# ---------------------------------------------------------------------------------------------------
# The sampler

class Watch:
    """``with Watch(device_type, gpus) as w: run ...``; then ``w.summary(span)`` for the record."""

    def __init__(self, device_type: str, gpus: list[int] | None = None, interval: float = INTERVAL_S):
        self.device_type, self.interval = device_type, interval
        self.cpus = usable_cpu_set()
        self.gpus = Gpus(gpus or [])
        self.samples: list[dict] = []
        self.sampler_cpu = 0.0
        self.errors, self.error = 0, None
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, name="bench-machine-watch", daemon=True)

    def __enter__(self):
        self.load_before = list(os.getloadavg())
        self.tick()
        self._thread.start()
        return self

    def __exit__(self, *exc):
        self._stop.set()
        self._thread.join()
        self.tick()
        self.load_after = list(os.getloadavg())
        self.gpus.close()
        return False

    def _loop(self):
        t0 = time.thread_time()
        while not self._stop.wait(self.interval):
            try:
                self.tick()
            except Exception as e:  # noqa: BLE001 - a sampler must never take a run down; the record says why it missed
                self.errors += 1
                self.error = self.error or f"{type(e).__name__}: {e}"
        self.sampler_cpu = time.thread_time() - t0

    def tick(self) -> None:
        t = time.time()
        busy = cpu_busy_seconds(self.cpus)
        ours, tree = tree_cpu()
        gpus = self.gpus.sample()
        for g in gpus:
            g["others"] = other_gpu_pids(g.pop("pids"), tree) if g.get("pids") is not None else []
        self.samples.append({"t": t, "busy": busy, "ours": ours, "gpus": gpus})

    # -- after the run --------------------------------------------------------------------------

    def _others_at(self, t: float) -> float | None:
        """Others' cumulative CPU seconds at ``t``, interpolated between samples."""
        pts = [(s["t"], s["busy"] - s["ours"]) for s in self.samples if s["busy"] is not None]
        if not pts:
            return None
        if t <= pts[0][0]:
            return pts[0][1]
        for (t0, v0), (t1, v1) in zip(pts, pts[1:]):
            if t <= t1:
                return v0 + (v1 - v0) * (t - t0) / (t1 - t0) if t1 > t0 else v1
        return pts[-1][1]

    def cpu_part(self, span) -> dict | None:
        a, b = span
        if b <= a:
            return None
        start, end = self._others_at(a), self._others_at(b)
        if start is None:
            return None
        others = max(0.0, end - start)
        return {"span": [a, b], "span_seconds": b - a, "others_cpu_seconds": others,
                "others_cpu_cores": others / (b - a), "others_cpu_share": others / (len(self.cpus) * (b - a))}

    def gpu_part(self, span) -> list[dict]:
        a, b = span
        near = lambda t: min(self.samples, key=lambda s: abs(s["t"] - t))  # noqa: E731
        inside = [s for s in self.samples if a - self.interval <= s["t"] <= b + self.interval] or [near(a), near(b)]
        out = []
        for i, index in enumerate(self.gpus.indices):
            if not all(len(s["gpus"]) > i for s in self.samples):
                continue
            state = lambda s: {"sm_mhz": s["gpus"][i]["sm_mhz"], "mem_mhz": s["gpus"][i]["mem_mhz"],  # noqa: E731
                               "reasons": trust.throttle_names(s["gpus"][i]["reasons"])}
            out.append({"index": index, "start": state(near(a)), "end": state(near(b)),
                        "throttled": sorted({n for s in inside for n in trust.throttle_names(s["gpus"][i]["reasons"])}),
                        "other_processes": sorted({p for s in inside for p in s["gpus"][i]["others"]})})
        return out

    def summary(self, windows_span=None, compute_only_span=None) -> dict:
        from_windows = bool(windows_span) and len(windows_span) == 2
        span = tuple(windows_span) if from_windows else (self.samples[0]["t"], self.samples[-1]["t"])
        return {
            "cpus": len(self.cpus),
            "load_before": self.load_before,
            "load_after": self.load_after,
            "span_source": "windows" if from_windows else "whole run (the record has no windows_wall_span)",
            "windows": self.cpu_part(span),
            "compute_only": self.cpu_part(tuple(compute_only_span)) if compute_only_span else None,
            "gpus": self.gpu_part(span) if self.gpus.indices else [],
            "nvml": None if self.device_type != "cuda" else (self.gpus.reason or "ok"),
            "sample_interval_seconds": self.interval,
            "samples": len(self.samples),
            "sampler_cpu_seconds": round(self.sampler_cpu, 4),
            "sampler_errors": self.errors,
            "sampler_error": self.error,  # the first one's type and message
            "nvml_unsupported": dict(self.gpus.unsupported),  # query -> why NVML could not answer it on these GPUs
        }


def attach(rec: dict, watch: Watch, results_dir: Path, waited: dict | None = None) -> dict:
    """Add the machine state to an ok run's record on disk (atomically replaced: a reader sees the old whole file or
    the new one) and return the updated record. Only a record whose rank 0 ran on this host (the watch saw its
    windows); skipped and failed records stay as they are."""
    from bench.core import results

    path = Path(results_dir) / f"{rec.get('run_id')}.json"
    hosts = rec.get("hosts") or []
    if rec.get("status") != "ok" or rec.get("record_elsewhere") or (hosts and hosts[0] != socket.gethostname()):
        return rec
    try:
        on_disk = json.loads(path.read_text())
    except (OSError, ValueError):
        return rec
    m = watch.summary(on_disk.get("windows_wall_span"), on_disk.get("compute_only_wall_span"))
    m["waited_for_quiet"] = waited
    reasons = trust.machine_reasons(m, on_disk.get("device_type"))
    on_disk.update(machine=m, disturbed=bool(reasons), disturbed_reasons=reasons)
    results.write_json_atomic(on_disk, path, overwrite=True)
    return {**rec, **on_disk}


def probe(device_type: str, gpus: list[int], seconds: float = PROBE_S) -> list[str]:
    """Why the machine is not quiet right now (others' CPU use over ``seconds``, other processes or throttling on
    ``gpus``); empty when it is."""
    with Watch(device_type, gpus, interval=seconds) as w:
        time.sleep(seconds)
    m, during = w.summary(), f"the last {seconds:g} s"
    cpu = trust.cpu_reason(m["windows"], m["cpus"], device_type, during)
    return ([cpu] if cpu else []) + trust.gpu_reasons(m["gpus"], during)


def wait_quiet(device_type: str, gpus: list[int], bound_s: float, say=print, clock=time.monotonic,
               look=probe) -> dict:
    """Look at the machine until it is quiet or ``bound_s`` seconds have passed; returns what was seen."""
    start = clock()
    reasons = look(device_type, gpus)
    said = False
    while reasons and clock() - start < bound_s:
        if not said:
            say(f"waiting up to {bound_s:g} s for a quiet machine: {'; '.join(reasons)}")
            said = True
        reasons = look(device_type, gpus)
    waited = round(clock() - start, 1)
    if reasons:
        say(f"the machine did not become quiet within {bound_s:g} s ({'; '.join(reasons)}): running anyway, the "
            "record will say whether the run was disturbed")
    return {"quiet": not reasons, "waited_seconds": waited, "bound_seconds": bound_s, "reasons": reasons}
