"""coding/workers.py: the processes that code and decode a seed-only stream's parts (0.9.26)."""
import os
import sys
import time

import pytest

from scoreflow_codec.coding import workers
from scoreflow_codec.errors import SfcError


def _pid_and_square(x):
    return os.getpid(), x * x


def _fail(x):
    raise ValueError(f"bad {x}")


def _die(x):
    os._exit(3)


def _fail_or_sleep(x):
    if x == 0:
        raise ValueError("the first part is corrupt")
    time.sleep(60)


def test_run_keeps_the_order_and_uses_other_processes():
    items = [(k,) for k in range(6)]
    one = workers.run(_pid_and_square, items, 1)
    assert [v for _, v in one] == [k * k for k in range(6)] and {p for p, _ in one} == {os.getpid()}
    two = workers.run(_pid_and_square, items, 2)
    assert [v for _, v in two] == [k * k for k in range(6)] and os.getpid() not in {p for p, _ in two}
    assert workers.run(_pid_and_square, items[:1], 4)[0][0] == os.getpid()  # one item: no process started


def test_a_workers_exception_is_raised_as_itself_and_a_dead_worker_says_so():
    with pytest.raises(ValueError, match="bad 1"):
        workers.run(_fail, [(1,), (2,)], 2)
    with pytest.raises(SfcError, match="worker process died.*--jobs"):
        workers.run(_die, [(1,), (2,)], 2)


def test_an_error_stops_the_other_workers_at_once():
    """A corrupt part (or Ctrl-C) need not wait for the other parts to be decoded."""
    t0 = time.perf_counter()
    with pytest.raises(ValueError, match="corrupt"):
        workers.run(_fail_or_sleep, [(0,), (1,), (2,)], 2)
    assert time.perf_counter() - t0 < 20


def test_workers_start_by_spawn_only_where_the_program_allows(monkeypatch):
    """Where processes spawn (macOS, Windows), work goes to other processes unasked only in a program
    that says its main module is guarded (sfcodec): an API user's unguarded script would run again in
    every worker (0.9.26's parts did that). Asked for (jobs given), it always may."""
    monkeypatch.setattr(workers, "usable_cores", lambda: 8)
    monkeypatch.setattr(workers, "available_memory", lambda: None)
    monkeypatch.setattr(workers, "forks", lambda: False)
    monkeypatch.setattr(workers, "_SPAWN_SAFE", False)
    assert not workers.parallel_by_default() and workers.auto_jobs(12, 1 << 20) == 1
    workers.allow_spawn()
    assert workers.parallel_by_default() and workers.auto_jobs(12, 1 << 20) == 8
    monkeypatch.setattr(workers, "_SPAWN_SAFE", False)
    monkeypatch.setattr(workers, "forks", lambda: True)
    assert workers.parallel_by_default() and workers.auto_jobs(12, 1 << 20) == 8


def test_sfcodec_allows_spawn(monkeypatch):
    """sfcodec's entry point says its main module is guarded (and runs the command)."""
    import cli.main as cli_main

    monkeypatch.setattr(workers, "_SPAWN_SAFE", False)
    monkeypatch.setattr(sys, "argv", ["sfcodec", "--help"])
    with pytest.raises(SystemExit) as e:
        cli_main.main()
    assert e.value.code == 0 and workers._SPAWN_SAFE


def test_auto_jobs_stays_within_the_cores_the_parts_and_the_memory(monkeypatch):
    monkeypatch.setattr(workers, "forks", lambda: True)
    monkeypatch.setattr(workers, "usable_cores", lambda: 8)
    monkeypatch.setattr(workers, "available_memory", lambda: 3 << 30)
    assert workers.auto_jobs(12, 1 << 20) == 3   # 3 GiB at 1 KiB a pixel of 1 Mpix parts
    assert workers.auto_jobs(2, 1 << 20) == 2    # no more than the parts
    assert workers.auto_jobs(12, 1 << 30) == 1   # at least one
    monkeypatch.setattr(workers, "available_memory", lambda: None)
    assert workers.auto_jobs(12, 1 << 20) == 8   # memory unknown: the cores
    for bad in (0, -1, 1.5, True, "2"):
        with pytest.raises(ValueError):
            workers.check_jobs(bad)
    workers.check_jobs(None)
    workers.check_jobs(3)


def test_the_machine_is_described():
    free = workers.available_memory()
    assert free is None or free > 0
    assert workers.usable_cores() >= 1


def _sleep_then(x, seconds):
    time.sleep(seconds)
    return os.getpid(), x


def test_background_runs_in_another_process_while_this_one_works():
    """workers.background (0.9.27, the seed codec's analysis): fn in one other process; result()
    waits for it; its exception raised here as itself; a dead process an SfcError (leaving the scope);
    an error in the caller's scope stops it at once."""
    with workers.background(_sleep_then, 7, 0.5) as pending:
        t0 = time.perf_counter()
        busy = sum(range(10 ** 5))  # this process works on meanwhile
        pid, x = pending.result()
    assert x == 7 and pid != os.getpid() and busy and time.perf_counter() - t0 < 20
    with workers.background(_fail, 3) as pending:
        with pytest.raises(ValueError, match="bad 3"):
            pending.result()
    with pytest.raises(SfcError, match="worker process died.*--jobs"):  # as the scope ends
        with workers.background(_die, 0) as pending:
            pending.result()
    t0 = time.perf_counter()
    with pytest.raises(KeyError):
        with workers.background(_sleep_then, 1, 60):
            raise KeyError("the caller failed (or Ctrl-C)")
    assert time.perf_counter() - t0 < 20
    assert workers.in_main_process()
    assert workers.run(_in_main, [(0,), (1,)], 2) == [False, False]


def test_background_calls_run_in_turn_in_one_process_and_each_result_comes_when_made():
    """workers.background_calls (0.10.5: the seed codec's analysis takes the last plane's least squares
    first, then the first option): the calls in the order given, all in one other process, and the first
    one's result while the second still runs."""
    with workers.background_calls([(_sleep_then, 1, 0.0), (_sleep_then, 2, 3.0)]) as (first, second):
        pid, x = first.result()
        assert x == 1 and pid != os.getpid() and not second.done()
        assert second.result() == (pid, 2)
    with workers.background_calls([]) as none:
        assert none == []


def _in_main(x):
    return workers.in_main_process()


def _ctrl_c_handler(x):
    import signal
    return signal.getsignal(signal.SIGINT)


def test_workers_leave_ctrl_c_to_the_parent():
    """Ctrl-C reaches every process of the terminal's group; the workers ignore it (the parent stops
    them), so an interrupted command prints one line, not a worker's traceback too."""
    import signal

    # as in a terminal (a test run started in the background inherits SIGINT ignored already)
    before = signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        assert workers.run(_ctrl_c_handler, [(0,), (1,)], 2) == [signal.SIG_IGN] * 2
        with workers.background(_ctrl_c_handler, 0) as pending:
            assert pending.result() == signal.SIG_IGN
        assert signal.getsignal(signal.SIGINT) is signal.default_int_handler  # this process's own untouched
    finally:
        signal.signal(signal.SIGINT, before)


def _write_slowly(path):
    from scoreflow_codec import fileio

    os.fsync = lambda fd: time.sleep(60)  # in this worker only: stopped while it writes
    fileio.atomic_write(path, b"half a file")


def test_a_stopped_worker_leaves_no_temporary_file(tmp_path):
    """sfcodec -d's workers write their own files: one stopped in the middle (Ctrl-C, or another
    worker's error: SIGTERM from the parent) removes its temporary file, and no output appears."""
    d = tmp_path / "out"
    d.mkdir()
    t0 = time.perf_counter()
    with pytest.raises(KeyError):
        with workers.background(_write_slowly, d / "x.sfc"):
            while not list(d.iterdir()) and time.perf_counter() - t0 < 30:
                time.sleep(0.05)
            assert [p.name.endswith(".tmp") for p in d.iterdir()] == [True]
            raise KeyError("stop")
    assert list(d.iterdir()) == [] and time.perf_counter() - t0 < 30


def _interval(k, seconds):
    t0 = time.time()
    time.sleep(seconds)
    return t0, time.time()


def _overlap(a, b) -> bool:
    return a[0] < b[1] and b[0] < a[1]


def test_each_runs_no_more_at_once_than_the_memory_budget_holds():
    """each(..., need, budget): an item starts only where its need fits beside those running (the first
    that fits, in order), one larger than the budget alone: two large files never run together, the
    small ones run beside either, and every item is done once."""
    need, items = [4, 4, 1, 1], [(k, 0.6) for k in range(4)]
    got = dict(workers.each(_interval, items, 4, need, 6))
    assert sorted(got) == [0, 1, 2, 3]
    assert not _overlap(got[0], got[1])  # 4 + 4 > 6
    assert _overlap(got[0], got[2]) and _overlap(got[0], got[3])  # 4 + 1 + 1: 2 and 3 start beside 0, before 1
    # an item above the budget runs alone; without a budget (memory unknown) all at once
    got = dict(workers.each(_interval, [(k, 0.4) for k in range(3)], 3, [9, 1, 1], 5))
    assert not _overlap(got[0], got[1]) and not _overlap(got[0], got[2]) and _overlap(got[1], got[2])
    got = dict(workers.each(_interval, [(k, 0.6) for k in range(3)], 3, [9, 9, 9], None))
    assert _overlap(got[0], got[1]) and _overlap(got[1], got[2])
    # the largest first (the longest to code): 3 starts with 0, before 1 and 2, which follow in order
    got = dict(workers.each(_interval, [(k, 0.5) for k in range(4)], 2, [1, 1, 1, 5], None))
    assert _overlap(got[3], got[0]) and got[3][0] < min(got[1][0], got[2][0]) and got[0][0] < got[2][0]


def _cgroup(tmp_path, lines: str, files: dict) -> tuple[str, str]:
    tmp_path.mkdir()
    proc = tmp_path / "cgroup"
    proc.write_text(lines)
    for rel, text in files.items():
        (tmp_path / "fs" / rel).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / "fs" / rel).write_text(text)
    return str(proc), str(tmp_path / "fs")


def test_the_memory_a_container_or_job_limit_leaves(tmp_path, monkeypatch):
    """cgroup_room: limit minus usage of this process's memory cgroup, or of one above it where that is
    tighter (v2: memory.max / memory.current; v1: the memory controller's files, also where its path is
    not in the container's view and the top is the container's own cgroup); None where nothing limits."""
    G = 1 << 30
    v2 = {"a/b/memory.max": str(4 * G), "a/b/memory.current": str(G), "a/memory.max": "max", "a/memory.current": "5"}
    assert workers.cgroup_room(*_cgroup(tmp_path / "1", "0::/a/b\n", v2)) == 3 * G
    v2["a/memory.max"], v2["a/memory.current"] = str(2 * G), str(G + G // 2)  # the parent's limit is tighter
    assert workers.cgroup_room(*_cgroup(tmp_path / "2", "0::/a/b\n", v2)) == G // 2
    v2["a/memory.current"] = str(3 * G)  # over its limit (reclaim pending): nothing left, not negative
    assert workers.cgroup_room(*_cgroup(tmp_path / "3", "0::/a/b\n", v2)) == 0
    v1 = {"memory/job/x/memory.limit_in_bytes": "9223372036854771712", "memory/job/x/memory.usage_in_bytes": "7",
          "memory/memory.limit_in_bytes": str(2 * G), "memory/memory.usage_in_bytes": str(G // 2)}
    lines = "9:name=systemd:/\n4:memory:/job/x\n1:cpu:/\n0::/\n"
    assert workers.cgroup_room(*_cgroup(tmp_path / "4", lines, v1)) == 3 * G // 2
    del v1["memory/memory.limit_in_bytes"]  # no limit anywhere (this machine's case)
    assert workers.cgroup_room(*_cgroup(tmp_path / "5", lines, v1)) is None
    combined = {"memory/j/memory.limit_in_bytes": str(G), "memory/j/memory.usage_in_bytes": "0"}
    assert workers.cgroup_room(*_cgroup(tmp_path / "6", "3:cpu,memory:/j\n", combined)) == G
    assert workers.cgroup_room(*_cgroup(tmp_path / "7", "0::/a\n", {"a/memory.max": "garbage",
                                                                    "a/memory.current": "1"})) is None
    assert workers.cgroup_room(str(tmp_path / "none"), str(tmp_path)) is None
    # available_memory: no more than the cgroup allows, whatever the machine has
    monkeypatch.setattr(workers, "cgroup_room", lambda: G // 4)
    assert workers.available_memory() == G // 4
    monkeypatch.setattr(workers, "cgroup_room", lambda: None)
    assert workers.available_memory() > G // 4  # this machine's MemAvailable


def _deaf_then_sleep(x):
    import signal
    signal.signal(signal.SIGTERM, signal.SIG_IGN)  # as a worker blocked where its SIGTERM handler never runs
    time.sleep(60)


def test_a_worker_that_does_not_stop_on_sigterm_is_killed():
    """_halt: SIGTERM, then SIGKILL after the grace: the scope never waits for ever on a worker (CI once
    hung 19 minutes on one blocked on the pool's queue lock, its SIGTERM never acted on)."""
    t0 = time.perf_counter()
    with pytest.raises(KeyError):
        with workers.background(_deaf_then_sleep, 0):
            time.sleep(1.0)  # the worker is in its sleep, SIGTERM ignored
            raise KeyError("the caller failed")
    assert time.perf_counter() - t0 < 20


def _echo_ahead(buf, ready, done, steps):
    """A companion: step k writes k + 1 to buf once the parent has released `done` for step k - 1."""
    for k in range(steps):
        if k and not workers.acquire_in_companion(done, poll=0.2):
            return
        buf[k] = k + 1
        ready.release()


@pytest.mark.skipif(not workers.forks(), reason="companions start by fork (Linux) only")
def test_a_companion_works_a_step_ahead_through_shared_memory():
    """workers.companion (0.10.4, the seed codec's decoder): a forked process that writes into an array of
    shared memory made before the fork, each step handed over by semaphores, and ends on its own; acquire
    says False once it is gone without releasing."""
    import numpy as np

    buf = workers.shared_zeros((50,), np.int64)
    ready, done = workers.semaphore(), workers.semaphore()
    proc = workers.companion(_echo_ahead, buf, ready, done, 50)
    assert proc.pid != os.getpid()
    for k in range(50):
        assert workers.acquire(ready, proc) and buf[k] == k + 1
        done.release()
    workers.stop(proc, wait=5.0)
    assert proc.exitcode == 0
    proc = workers.companion(_echo_ahead, buf, ready, done, 0)  # releases nothing
    assert not workers.acquire(ready, proc, poll=0.05)
    workers.stop(proc)


_ORPHAN = """
import sys, time
from scoreflow_codec.coding import workers
sem = workers.semaphore()
proc = workers.companion(workers.acquire_in_companion, sem, 0.2)   # waits for ever on sem
print(proc.pid, flush=True)
time.sleep(60)
"""


@pytest.mark.skipif(not workers.forks(), reason="companions start by fork (Linux) only")
def test_a_companion_ends_when_its_parent_is_killed():
    """A parent killed outright (SIGKILL: no cleanup of its own) leaves no companion behind: it sees its
    parent gone while it waits, and ends."""
    import signal
    import subprocess

    parent = subprocess.Popen([sys.executable, "-c", _ORPHAN], stdout=subprocess.PIPE, text=True)
    child = int(parent.stdout.readline())
    os.kill(parent.pid, signal.SIGKILL)
    parent.wait()
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        try:
            os.kill(child, 0)  # still there (or a zombie until init reaps it)
            with open(f"/proc/{child}/stat") as f:
                if f.read().split(")")[-1].split()[0] == "Z":
                    break
        except (ProcessLookupError, FileNotFoundError):
            break
        time.sleep(0.1)
    else:
        os.kill(child, signal.SIGKILL)
        pytest.fail("the companion outlived its killed parent by 10 s")
