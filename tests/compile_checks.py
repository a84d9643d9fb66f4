"""What the ahead-of-time compile tests share (tests/test_triton_compile.py,
test_block_compile.py, test_tree_compile.py): the worker subprocess that compiles for sm_90, and
the checks on the report tests/sass.py's ``compile_report`` makes of each kernel.

The workers run without ``TRITON_INTERPRET``: under the interpreter ``@triton.jit`` builds objects
that cannot be compiled.
"""

from __future__ import annotations

import json
import os
import queue
import subprocess
import sys
import threading

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
TESTS = os.path.join(ROOT, "tests")


def _run(worker: str, argv: tuple):
    """The JSON the ``worker`` script prints last, run with this checkout and tests/ (sass.py) on
    its path."""
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    env["PYTHONPATH"] = os.pathsep.join([ROOT, TESTS, env.get("PYTHONPATH", "")])
    # Compiled here, not taken from Triton's cache: a cached kernel of the same source compiled
    # from another checkout (or before a module moved) has line tables naming that one's files.
    env["TRITON_ALWAYS_COMPILE"] = "1"
    proc = subprocess.Popen([sys.executable, "-c", worker, *argv], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, env=env, cwd=ROOT)
    _running.append(proc)
    try:
        out, err = proc.communicate(timeout=900)
    finally:
        _running.remove(proc)
    assert proc.returncode == 0, err[-4000:]
    return json.loads(out.strip().splitlines()[-1])


# Workers started ahead (``prefetch``), one at a time on a background thread: ptxas is
# single-threaded and the suite runs in one process, so the compiles take the second core while
# the other tests run (conftest.py starts them at collection and runs their tests last).
_jobs: dict = {}
_queue: queue.Queue = queue.Queue()
_running: list = []


class _Job:
    def __init__(self):
        self.done = threading.Event()
        self.result = self.error = None


_stopped = threading.Event()


def _work() -> None:
    while True:
        key, job = _queue.get()
        try:
            if _stopped.is_set():
                raise RuntimeError("the session ended before this compile worker ran")
            job.result = _run(*key)
        except BaseException as error:  # raised where the result is asked for
            job.error = error
        job.done.set()


def prefetch(worker: str, *argv: str) -> None:
    """Start ``run_worker(worker, *argv)`` in the background (after those started before)."""
    key = (worker, argv)
    if key in _jobs:
        return
    if not _jobs:
        threading.Thread(target=_work, daemon=True).start()
    _jobs[key] = job = _Job()
    _queue.put((key, job))


def stop() -> None:
    """The session is over: start no queued worker, kill the one running."""
    _stopped.set()
    for proc in list(_running):
        proc.kill()


def run_worker(worker: str, *argv: str):
    """The JSON the ``worker`` script prints last: the prefetched run's, or a run now."""
    job = _jobs.get((worker, argv))
    if job is None:
        return _run(worker, argv)
    job.done.wait()
    if job.error is not None:
        raise job.error
    return job.result


def assert_no_spills(report: dict, context) -> None:
    """Nothing in local memory: no local arrays, no stack frame, no spill stores or loads."""
    assert not report["local_in_ptx"], context
    r = report["resources"]
    assert r.get("LOCAL", 0) == 0 and r.get("STACK", 0) == 0, (context, r)
    assert report["spills"] == 0, (context, r)


def assert_16_byte_row_loads(report: dict, prob: str, context) -> None:
    """Every row loop reads its rows with 16-byte loads only: 1024 values over the program's
    threads (128 at 4 warps: 8 a thread, 2 fp32 or 1 fp16/bf16 16-byte loads per row per chunk),
    for each chunk an iteration takes (ptxas may unroll), and no narrower load (the residual loop
    reads two rows)."""
    per_row = 1024 * (4 if prob == "fp32" else 2) // 16 // (32 * report["num_warps"])
    for name, loop in report["row_loops"].items():
        per_chunk = per_row * (2 if name == "residual" else 1)
        assert loop["loads16"] > 0 and loop["loads16"] % per_chunk == 0, (context, name, loop)
        assert loop["other_loads"] == 0, (context, name, loop)


def assert_issue_bounds(budgets: list, count: int, share: float = 1.0) -> None:
    """Every one of the ``count`` budgeted row loops can stream faster than 1.25 x the H200's
    4.8 TB/s on instruction issue alone (tests/sass.py; benchmarks/sass_budget.py prints the
    tables), or ``share`` of that where docs/internals/kernel.md says why a loop sits at the
    goal."""
    from sass import GOAL_BYTES_PER_S

    assert len(budgets) == count
    for row in budgets:
        assert row["issue_bound"] >= share * GOAL_BYTES_PER_S, row
