"""Worker processes: the independent parts of a seed-only stream (stream.seed_parts, 0.9.26), a
seed codec encoder's first least-squares option beside the others (seed_codec._analysis, 0.9.27),
and sfcodec's files coded each alone (`-d`, cli/batch.py, 0.9.29: `each`).

A large photograph's seed codec file is coded in blocks of up to 1024x1024 pixels, each alone; from
0.9.26 each part (a block, or consecutive small ones) is its own ANS stack, so the parts are coded
and decoded in parallel, one process each. The bytes do not depend on how many processes run them.

How many: `jobs` None (the default) takes every core this process may run on, no more processes
than parts, and no more than the available memory (available_memory: MemAvailable, within this
process's cgroup's limit) holds at PART_PEAK_BYTES_PER_PIXEL for the largest part (measured, 0.9.26:
a worker's peak RSS 1,561 MiB on a 1024x1024 part, which counts the pages it shares with its parent,
whose RSS was 603 MiB at most when it forked). Processes start by fork on Linux (the parent's imports
and the image come along at no cost) and by spawn elsewhere, where by default only
in a program that says its main module is guarded (`allow_spawn`: sfcodec; 0.9.28): an API user's
script without `if __name__ == "__main__"` would run again in every spawned worker.
"""
from __future__ import annotations

import concurrent.futures
import contextlib
import mmap
import multiprocessing
import os
import signal
import sys
import time
from concurrent.futures.process import BrokenProcessPool
from pathlib import Path
from typing import Callable, Sequence

import numpy as np

from ..errors import SfcError

PART_PEAK_BYTES_PER_PIXEL = 1024


def usable_cores() -> int:
    """The cores this process may run on (its affinity where the OS tells it, else the count)."""
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except (AttributeError, OSError):
        return max(1, os.cpu_count() or 1)


def available_memory() -> int | None:
    """Bytes of memory available to new processes: Linux's MemAvailable, and no more than this process's
    memory cgroup still allows (a container's or a job scheduler's limit, which MemAvailable, the whole
    machine's, does not show; 0.9.30); None where unknown."""
    mem = None
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    mem = int(line.split()[1]) * 1024
                    break
    except (OSError, ValueError, IndexError):
        pass
    room = cgroup_room()
    return room if mem is None else mem if room is None else min(mem, room)


_NO_LIMIT = 1 << 60  # cgroup v1 writes "no limit" as a huge number (2**63 rounded down to a page)


def cgroup_room(proc: str = "/proc/self/cgroup", root: str = "/sys/fs/cgroup") -> int | None:
    """What this process's memory cgroups still allow, limit minus usage, the tightest of them (its own and
    every one above it: a limit may be set on a parent), from cgroup v2 (memory.max, memory.current) or v1
    (the memory controller's memory.limit_in_bytes, memory.usage_in_bytes); None where none sets a limit or
    they cannot be read. Inside a container the cgroup's path may not exist in its view of `root`, whose own
    top is then the container's cgroup: that is read too."""
    try:
        with open(proc) as f:
            lines = f.read().splitlines()
    except OSError:
        return None
    found = []
    for line in lines:
        _, controllers, path = (line.split(":", 2) + ["", ""])[:3]
        if controllers == "":  # v2
            base, files = Path(root), ("memory.max", "memory.current")
        elif "memory" in controllers.split(","):
            base, files = Path(root) / "memory", ("memory.limit_in_bytes", "memory.usage_in_bytes")
        else:
            continue
        parts = [p for p in path.split("/") if p]
        for k in range(len(parts), -1, -1):  # the cgroup, then each one above it, up to the top
            room = _room(base.joinpath(*parts[:k]), *files)
            if room is not None:
                found.append(room)
    return min(found) if found else None


def _room(d: Path, limit_file: str, usage_file: str) -> int | None:
    try:
        limit = (d / limit_file).read_text().strip()
        usage = int((d / usage_file).read_text().strip())
    except (OSError, ValueError):
        return None
    if limit == "max" or not limit.isdigit() or int(limit) >= _NO_LIMIT:
        return None
    return max(0, int(limit) - usage)


def auto_jobs(n_parts: int, largest_part_pixels: int) -> int:
    """Processes for n_parts parts: the usable cores, at most one per part, within available memory;
    1 where workers would start by spawn in a program that did not allow it (parallel_by_default)."""
    if not parallel_by_default():
        return 1
    jobs = min(usable_cores(), n_parts)
    mem = available_memory()
    if mem is not None:
        jobs = min(jobs, mem // max(1, PART_PEAK_BYTES_PER_PIXEL * largest_part_pixels))
    return max(1, jobs)


def check_jobs(jobs: int | None) -> None:
    if jobs is not None and (isinstance(jobs, bool) or not isinstance(jobs, int) or jobs < 1):
        raise ValueError(f"jobs must be a positive integer or None (automatic), not {jobs!r}")


def in_main_process() -> bool:
    """Whether this is the process the user started (a worker starts no workers of its own)."""
    return multiprocessing.parent_process() is None


def forks() -> bool:
    """Whether worker processes start by fork here (Linux): at no cost, and without re-running the
    caller's main module, as spawn (elsewhere) does in a script without a __main__ guard."""
    return sys.platform.startswith("linux")


_SPAWN_SAFE = False  # set by a program whose main module is guarded (sfcodec: allow_spawn)


def allow_spawn() -> None:
    """Say that this program's main module is guarded (`if __name__ == "__main__"`), so that workers
    may start by spawn (macOS, Windows) without re-running it; `sfcodec` calls it. Not called, an API
    user's script starts worker processes by default only where they fork (parallel_by_default)."""
    global _SPAWN_SAFE
    _SPAWN_SAFE = True


def parallel_by_default() -> bool:
    """Whether work goes to other processes when the caller did not ask (jobs None): where processes
    fork, or where the program said its main module is guarded (allow_spawn). A spawned worker
    re-imports the main module: an unguarded script would run again in each (and Python refuses)."""
    return forks() or _SPAWN_SAFE


def _context():
    return multiprocessing.get_context("fork" if forks() else "spawn")


def _start_worker(threads: int | None = None) -> None:
    """Each worker process at its start. It ignores Ctrl-C: the terminal sends it to every process of
    the group, and the parent, which handles it, stops the workers; a worker of its own would print a
    traceback beside "sfcodec: interrupted" (2 and 3 of 8 interrupted Kodak compresses did, before this).

    threads: torch's CPU threads in this worker (several workers share the cores): set before torch
    loads (OMP_NUM_THREADS, unless the user chose it), or 1 where the worker was forked from a
    process that had torch loaded already (a forked OpenMP runtime must not start threads again).

    A worker the parent stops (SIGTERM: Ctrl-C, or another worker's error) removes the temporary file
    it may be writing (sfcodec -d: each worker writes its file) and exits at once."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, _stop)
    if threads is None:
        return
    if "torch" in sys.modules:
        sys.modules["torch"].set_num_threads(1)
    else:
        os.environ.setdefault("OMP_NUM_THREADS", str(threads))


def _stop(signum, frame) -> None:
    from .. import fileio

    fileio.remove_unfinished()
    os._exit(128 + signum)


@contextlib.contextmanager
def _pool(n: int, advice: str, threads: int | None = None):
    """A pool of n processes for the scope. A process that dies (killed for memory) is an SfcError
    with `advice`; on any other exception (Ctrl-C among them) the processes are stopped at once, as
    what they do is no longer wanted; otherwise the scope waits for them to end. threads: see
    _start_worker (None: torch's default in each worker)."""
    ex = concurrent.futures.ProcessPoolExecutor(max_workers=n, mp_context=_context(), initializer=_start_worker,
                                                initargs=(threads,))
    try:
        yield ex
    except BrokenProcessPool:
        _halt(ex)
        raise SfcError(f"a worker process died (out of memory?); {advice}") from None
    except BaseException:
        _halt(ex)
        raise
    finally:
        ex.shutdown(wait=True, cancel_futures=True)


def _halt(ex: concurrent.futures.ProcessPoolExecutor, grace: float = 5.0) -> None:
    """Stop a pool's processes at once: SIGTERM (each removes the file it may be writing and exits,
    _stop), then SIGKILL for any still there after `grace` seconds. A worker stopped while it held the
    task queue's lock leaves the lock held, and the shutdown that follows waits for every process: one
    left alive would hang it for ever (seen once in CI, 2026-12-02: a decode of a corrupt file in
    parts, test_fuzz.test_random_parts, waited 19 minutes on a worker blocked on that lock)."""
    _end(list((getattr(ex, "_processes", None) or {}).values()), grace)


def _end(procs: list, grace: float) -> None:
    """SIGTERM to each process, then SIGKILL to any still there after `grace` seconds (_halt, stop)."""
    for proc in procs:
        with contextlib.suppress(OSError, ValueError):
            proc.terminate()
    deadline = time.monotonic() + grace
    for proc in procs:
        with contextlib.suppress(OSError, ValueError):
            proc.join(max(0.0, deadline - time.monotonic()))
    for proc in procs:
        with contextlib.suppress(OSError, ValueError):
            if proc.is_alive():
                proc.kill()
                proc.join(1.0)


@contextlib.contextmanager
def background(fn: Callable, *args):
    """fn(*args) in one other process while the caller works on (fn at module level); yields its
    future, whose result() waits for it (fn's exception raised as itself; a dead process, leaving the
    scope, as _pool's SfcError). Leaving the scope with an exception stops the process at once."""
    with background_calls([(fn, *args)]) as (pending,):
        yield pending


@contextlib.contextmanager
def background_calls(calls: Sequence[tuple]):
    """Each fn(*args) of calls, (fn, *args) tuples, in turn in one other process (background's): yields
    their futures in that order, so the caller can take each result as soon as it is made."""
    with _pool(1, "try --jobs 1 (everything in this process)") as ex:
        yield [ex.submit(fn, *args) for fn, *args in calls]


def run(fn: Callable, items: Sequence[tuple], jobs: int) -> list:
    """[fn(*item) for item in items], in `jobs` processes where jobs > 1 and there are several items
    (fn at module level: spawn pickles it by name). An exception in a worker is raised here, as itself;
    a worker that dies (killed for memory) is an SfcError that says so. On any other exception (Ctrl-C
    among them) the workers are stopped at once and the exception raised."""
    if jobs <= 1 or len(items) <= 1:
        return [fn(*item) for item in items]
    with _pool(min(jobs, len(items)), f"try fewer processes (--jobs, {jobs} now)") as ex:
        return list(ex.map(fn, *zip(*items)))


def each(fn: Callable, items: Sequence[tuple], jobs: int, need: Sequence[int] | None = None,
         budget: int | None = None):
    """Yields (i, fn(*items[i])) for every item as each is done, in `jobs` processes where jobs > 1 and
    there are several items (in this process, in order, otherwise). For independent whole tasks (a
    file each: sfcodec -d), so fn should catch its own errors and return them: an exception in a
    worker is raised here and stops the others, as in run. Each worker's torch gets its share of the
    cores (usable_cores() // jobs threads).

    need, budget: each item's memory (bytes, an estimate) and what the items running at once may hold
    together (None: no limit). An item starts where it fits beside those running (or where none runs: an
    item larger than the budget runs alone), so a folder of large photographs runs fewer at once than one
    of small ones (0.9.30). The items start largest need first (the inputs' order among equals): the
    largest take the longest, and started first they leave no core working alone at the end while the
    small ones fill the others."""
    if jobs <= 1 or len(items) <= 1:
        for i, item in enumerate(items):
            yield i, fn(*item)
        return
    n = min(jobs, len(items))
    need = [0] * len(items) if need is None else list(need)
    with _pool(n, f"try fewer processes (--jobs, {jobs} now)", threads=max(1, usable_cores() // n)) as ex:
        waiting, running, held = sorted(range(len(items)), key=lambda i: -need[i]), {}, 0
        while waiting or running:
            for i in list(waiting):
                if len(running) >= n:
                    break
                if running and budget is not None and held + need[i] > budget:
                    continue
                waiting.remove(i)
                running[ex.submit(fn, *items[i])] = i
                held += need[i]
            done, _ = concurrent.futures.wait(running, return_when=concurrent.futures.FIRST_COMPLETED)
            for fut in done:
                i = running.pop(fut)
                held -= need[i]
                yield i, fut.result()


# A companion (0.10.4): one process forked beside this one that works a step ahead of it through a
# sequential computation, the two exchanging arrays in shared memory and handing each step over with
# semaphores (the seed codec's decoder: its least-squares fits). Linux only (forks()): the shared arrays
# are anonymous mappings made before the fork, which a spawned process could not see.

def shared_zeros(shape: tuple[int, ...], dtype) -> np.ndarray:
    """A zeroed array in memory that the processes forked after it share with this one."""
    count = int(np.prod(shape, dtype=np.int64))
    buf = mmap.mmap(-1, max(1, count * np.dtype(dtype).itemsize))  # MAP_SHARED | MAP_ANONYMOUS
    return np.frombuffer(buf, dtype=dtype, count=count).reshape(shape)


def semaphore():
    """A semaphore at 0 that a companion forked after it shares."""
    return multiprocessing.get_context("fork").Semaphore(0)


def companion(fn: Callable, *args) -> multiprocessing.Process:
    """fn(*args) in a process forked now (forks() must hold): it ignores Ctrl-C as the pool's workers do
    (the parent, which handles it, stops it: stop), and ends with its parent at the latest (daemon)."""
    proc = multiprocessing.get_context("fork").Process(target=_companion_main, args=(fn, args), daemon=True)
    proc.start()
    return proc


def _companion_main(fn: Callable, args: tuple) -> None:
    _start_worker()
    fn(*args)


def acquire(sem, proc: multiprocessing.Process, poll: float = 0.5) -> bool:
    """Wait for sem while the companion proc lives: True once acquired, False where proc ended first."""
    while not sem.acquire(timeout=poll):
        if not proc.is_alive():
            return sem.acquire(block=False)  # it may have released it just before it ended
    return True


def acquire_in_companion(sem, poll: float = 1.0) -> bool:
    """In a companion: wait for sem while the parent lives; False where the parent is gone (killed)."""
    parent = multiprocessing.parent_process()
    while not sem.acquire(timeout=poll):
        if parent is None or not parent.is_alive():
            return False
    return True


def stop(proc: multiprocessing.Process, wait: float = 0.0, grace: float = 5.0) -> None:
    """End a companion: where it still runs after `wait` seconds (a companion whose work is done, ending
    on its own), SIGTERM, then SIGKILL after `grace` seconds more (_end)."""
    if wait > 0:
        with contextlib.suppress(OSError, ValueError):
            proc.join(wait)
    if proc.is_alive():
        _end([proc], grace)
