"""`train --profile-steps N`: where a training step's time goes, written to the run's log.

A device chunk returns its log, so one short run answers what the CPU cannot: how long a GPU step
takes, how many kernels it launches, and whether the host waits for the device inside it. After
`skip` warm-up steps (cuDNN's choices, caches) the next N steps run under torch.profiler; then the
log gets one summary line and a table of the operations by their own time on the device (on a CPU,
by their own CPU time). Training goes on unchanged: the profiled steps are ordinary steps.
"""
from __future__ import annotations

import logging
import time
from collections import Counter

import torch
from torch.profiler import ProfilerActivity, profile

# operations after which the host has waited for the device (a value read back, a synchronising copy)
WAITS = ("aten::_local_scalar_dense", "aten::nonzero", "cudaStreamSynchronize", "cudaDeviceSynchronize",
         "cudaEventSynchronize", "cudaMemcpy")


class StepProfiler:
    """Call step() after every training step; it starts after `skip` of them and stops `steps` later."""

    def __init__(self, steps: int, device: torch.device, skip: int = 5, log: logging.Logger | None = None):
        self.steps, self.dev, self.skip = int(steps), torch.device(device), int(skip)
        self.log = log or logging.getLogger("trainer")
        self.n, self.prof, self.t0 = 0, None, 0.0
        self.summary: dict | None = None  # set once the profiled steps are done

    def _sync(self) -> None:
        if self.dev.type == "cuda":
            torch.cuda.synchronize(self.dev)

    def step(self) -> None:
        """Count a step; start or finish the profile at its step."""
        if self.summary is not None or self.steps <= 0:
            return
        self.n += 1
        if self.n == self.skip:
            self._guarded(self._start)
        elif self.n == self.skip + self.steps:
            self._guarded(self._stop)

    def finish(self) -> None:
        """At the run's end: where it stopped inside the profiled steps, log the ones it made."""
        if self.prof is not None and self.summary is None:
            self.steps = self.n - self.skip
            self._guarded(self._stop if self.steps > 0 else self.prof.stop)

    def _guarded(self, action) -> None:
        """A profiler that fails (its CUDA side is not testable on a CPU) logs one warning and stops
        profiling; the training goes on."""
        try:
            action()
        except Exception as e:  # noqa: BLE001 - a profile is never worth a training run
            self.log.warning("profile: failed (%s: %s); training goes on without it", type(e).__name__, e)
            self.summary, self.prof = {"error": f"{type(e).__name__}: {e}"}, None

    def _start(self) -> None:
        acts = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if self.dev.type == "cuda" else [])
        self._sync()
        self.prof = profile(activities=acts)
        self.prof.start()
        self.t0 = time.perf_counter()

    def _stop(self) -> None:
        self._sync()
        wall = time.perf_counter() - self.t0
        self.prof.stop()
        self.summary = self._summarize(wall)
        s = self.summary
        where = ("a CPU: no device to wait for" if s["waits_per_step"] is None else
                 f"{s['kernels_per_step']:.0f} device kernels and {s['waits_per_step']:.1f} host waits a step")
        self.log.info("profile: %d steps, %.1f ms a step (wall), %.0f operations a step, %s", s["steps"],
                      s["ms_per_step"], s["ops_per_step"], where)
        self.log.info("profile: the operations by their own %s time\n%s", s["sorted_by"], s["table"])
        self.prof = None

    def _summarize(self, wall: float) -> dict:
        events = list(self.prof.events())
        cuda = torch.autograd.DeviceType.CUDA
        names = Counter(e.name for e in events if e.device_type != cuda)
        top = sum(1 for e in events if e.name.startswith("aten::") and e.device_type != cuda
                  and not _has_aten_parent(e))
        kernels = sum(1 for e in events if e.device_type == cuda)
        # on a CPU nothing waits: the fused Adam's CPU kernel, for one, reads its scalars with item()
        waits = sum(names[n] for n in WAITS) / self.steps if self.dev.type == "cuda" else None
        key = "self_cuda_time_total" if self.dev.type == "cuda" else "self_cpu_time_total"
        return {"steps": self.steps, "ms_per_step": 1000 * wall / self.steps, "ops_per_step": top / self.steps,
                "kernels_per_step": kernels / self.steps, "waits_per_step": waits,
                "sorted_by": "device" if self.dev.type == "cuda" else "CPU",
                "table": self.prof.key_averages().table(sort_by=key, row_limit=15)}


def _has_aten_parent(e) -> bool:
    p = e.cpu_parent
    while p is not None:
        if p.name.startswith("aten::"):
            return True
        p = p.cpu_parent
    return False
