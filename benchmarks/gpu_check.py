"""The GPU check: correctness first, then the benchmark grid, then host time per call, as steps
that each fit in under 5 minutes on an H200 and write their results to $OUT as they go.

    OUT=results python benchmarks/gpu_check.py                 # every step, in priority order
    OUT=results python benchmarks/gpu_check.py --step grid-bfloat16 --step host   # some steps
    OUT=/tmp/rehearsal python benchmarks/gpu_check.py --rehearse   # on CPU, tiny shapes, ~1 minute

Steps, in the order they run (docs/internals/performance.md, "How to run the GPU check", has their times):
  gpu-tests       pytest -m gpu: the Triton kernel on the GPU
  compile-tests   tests/test_triton_compile.py: the kernel compiles for Hopper
  recipes         tests/test_docs.py: the docs' CUDA-graph and torch.compile recipes, demo, benchmark
  demo            python -m specops.demo --device cuda
  agreement       benchmarks/measure_agreement.py: kernel vs reference tokens over many requests
  grid-float32    the benchmark grid in float32: our op and the eager baseline, each timed eagerly
  grid-bfloat16   and under CUDA-graph replay (eager against eager, replay against replay); bfloat16
  host            benchmarks/host_overhead.py (host time per call)

Each step runs in a child process with its own time limit; its output goes to $OUT/<step>.log as
it runs, and its outcome to $OUT/steps.jsonl when it ends. The grid appends one row per point to
$OUT/grid.csv (flushed), so an interrupted run still leaves every finished point. The run stops
starting steps when --budget-s is spent and says which were left for a later `--step` call.

--rehearse runs the same steps on CPU so that the first GPU run does not fail on a typo: the pytest
steps only collect their tests, the demo and the grid use tiny shapes, the kernel runs under
TRITON_INTERPRET=1 (SPECOPS_BACKEND=triton) and the CUDA-graph timings are skipped with a note.
"""

from __future__ import annotations

import argparse
import csv
import datetime
import json
import math
import os
import signal
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import torch

from common import (DTYPES, can_graph, copy_bandwidth, eager_chain_sampling, make_inputs, needed_bytes,
                    time_eager, time_graph)

ROOT = Path(__file__).resolve().parents[1]
HERE = Path(__file__).resolve().parent
L2_BYTES = 60 * 2**20  # an H100/H200 has 50-60 MB of L2: the inputs rotate through more than twice this


@dataclass(frozen=True)
class Step:
    name: str
    limit_s: int  # the child is stopped after this (under 5 minutes)
    what: str


STEPS = (
    Step("gpu-tests", 240, "pytest -m gpu"),
    Step("compile-tests", 180, "tests/test_triton_compile.py"),
    Step("recipes", 240, "tests/test_docs.py (CUDA-graph and compile recipes)"),
    Step("demo", 120, "python -m specops.demo on the device"),
    Step("agreement", 180, "kernel/reference agreement count"),
    Step("grid-float32", 280, "benchmark grid, float32"),
    Step("grid-bfloat16", 280, "benchmark grid, bfloat16"),
    Step("host", 180, "benchmarks/host_overhead.py"),
)
BY_NAME = {step.name: step for step in STEPS}


# ----------------------------------------------------------------------------- the entry
def parse_args(argv=None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                     epilog=__doc__.split("\n\n", 1)[1],
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--step", action="append", choices=list(BY_NAME), metavar="NAME",
                        help=f"run only this step (repeatable): {', '.join(BY_NAME)}")
    parser.add_argument("--rehearse", action="store_true", help="on CPU, tiny shapes (see above)")
    parser.add_argument("--budget-s", type=float, default=560.0,
                        help="start no step after this many seconds (default: 560)")
    parser.add_argument("--run-step", choices=list(BY_NAME), help=argparse.SUPPRESS)  # the child
    args = parser.parse_args(argv)
    if args.budget_s <= 0:
        parser.error(f"--budget-s must be positive, got {args.budget_s}")
    return args


def out_dir() -> Path:
    path = Path(os.environ.get("OUT") or ROOT / "results" / "gpu_check")
    path.mkdir(parents=True, exist_ok=True)
    return path


def child_env(rehearse: bool) -> dict:
    """The environment of every step: the repository importable (it need not be installed),
    unbuffered output (logs fill as the step runs), and on a rehearsal the kernel interpreted."""
    env = dict(os.environ, PYTHONUNBUFFERED="1")
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(ROOT), env.get("PYTHONPATH")) if p)
    if rehearse:
        env.update(TRITON_INTERPRET="1", SPECOPS_BACKEND="triton", CUDA_VISIBLE_DEVICES="")
    else:
        env.pop("TRITON_INTERPRET", None)
    return env


def run_child(argv: list[str], log, env: dict, limit_s: float) -> int:
    """Run argv with its output appended to ``log``; stop it and its children after limit_s."""
    log.write(f"$ {' '.join(argv)}\n")
    log.flush()
    proc = subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT, cwd=ROOT, env=env,
                            start_new_session=True)
    try:
        return proc.wait(timeout=max(limit_s, 1))
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
        log.write(f"\n[stopped after {limit_s:.0f} s]\n")
        return 124


def main(argv=None) -> int:
    args = parse_args(argv)
    if args.run_step:
        return run_step_here(args.run_step, args.rehearse, args.budget_s)
    if not args.rehearse and not torch.cuda.is_available():
        raise SystemExit("error: no CUDA device is visible; the GPU check needs one "
                         "(--rehearse runs its steps on CPU)")
    out = out_dir()
    env = child_env(args.rehearse)
    names = args.step or [step.name for step in STEPS]
    header = describe_environment(env, args.rehearse)
    with (out / "versions.txt").open("a") as f:
        f.write(header + "\n")
    print(header, flush=True)
    start = time.monotonic()
    results = []
    for name in names:
        step = BY_NAME[name]
        left = args.budget_s - (time.monotonic() - start)
        if left < 20:
            results.append({"step": name, "status": "not run: time budget spent", "seconds": 0})
            print(f"{name:14s} not run: time budget spent (rerun with --step {name})", flush=True)
            continue
        limit = min(step.limit_s, left)
        step_start = time.monotonic()
        with (out / f"{name}.log").open("w") as log:
            rc = run_child([sys.executable, str(Path(__file__).resolve()), "--run-step", name,
                            "--budget-s", f"{limit - 10:.0f}"] + (["--rehearse"] if args.rehearse else []),
                           log, env, limit)
        seconds = round(time.monotonic() - step_start, 1)
        status = {0: "passed", 124: f"stopped at its {limit:.0f} s limit"}.get(rc, f"failed (exit {rc})")
        result = {"step": name, "status": status, "seconds": seconds, "rehearsal": args.rehearse}
        results.append(result)
        with (out / "steps.jsonl").open("a") as f:
            f.write(json.dumps(result) + "\n")
        print(f"{name:14s} {status} ({seconds:.0f} s; log: {out / (name + '.log')})", flush=True)
        if rc != 0:
            print(tail(out / f"{name}.log", 15), flush=True)
    summary = summarise(out, header, results)
    print("\n" + summary, flush=True)
    return 0 if all(r["status"].startswith(("passed", "not run: benchmarks")) for r in results) else 1


def tail(path: Path, lines: int) -> str:
    text = path.read_text(errors="replace").splitlines()
    return "\n".join("    " + line for line in text[-lines:])


def describe_environment(env: dict, rehearse: bool) -> str:
    """Date, device and versions, asked of a child so this process stays free of CUDA."""
    code = ("import torch, triton, platform\n"
            "cuda = torch.cuda.is_available()\n"
            "p = torch.cuda.get_device_properties(0) if cuda else None\n"
            "dev = f'{p.name} ({p.multi_processor_count} SMs, {p.total_memory / 2**30:.0f} GiB)' if cuda "
            "else f'CPU {platform.machine()}'\n"
            "print(f'{dev} | torch {torch.__version__} | triton {triton.__version__} | CUDA {torch.version.cuda}"
            " | Python {platform.python_version()}')")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, cwd=ROOT)
    found = proc.stdout.strip() or f"(versions unknown: {proc.stderr.strip().splitlines()[-1:]})"
    return f"{datetime.date.today()} | {'rehearsal on CPU | ' if rehearse else ''}{found}"


def summarise(out: Path, header: str, results: list[dict]) -> str:
    """$OUT/summary.md: the steps' outcomes, and the grid as a table when it has rows."""
    lines = [header, "", "| step | outcome | seconds |", "| --- | --- | ---: |"]
    lines += [f"| {r['step']} | {r['status']} | {r['seconds']:.0f} |" for r in results]
    grid_csv = out / "grid.csv"
    if grid_csv.exists():
        with grid_csv.open() as f:
            rows = list(csv.DictReader(f))
        if rows:
            keys = ["dtype", "B", "N", "V", "needed_MB", "ours_eager_us", "base_eager_us", "speedup_eager",
                    "ours_graph_us", "base_graph_us", "speedup_graph", "fraction_of_copy"]
            lines += ["", f"grid ({len(rows)} points, all columns in {grid_csv.name}):", "",
                      "| " + " | ".join(keys) + " |", "|" + " ---: |" * len(keys)]
            lines += ["| " + " | ".join(r.get(k, "") for k in keys) + " |" for r in rows]
    text = "\n".join(lines) + "\n"
    (out / "summary.md").write_text(text)
    return text


# ----------------------------------------------------------------------------- the steps (child side)
def run_step_here(name: str, rehearse: bool, budget_s: float) -> int:
    env = child_env(rehearse)
    py = sys.executable
    if name == "gpu-tests":
        collect = ["--collect-only"] if rehearse else []
        # Modules whose test-only dependencies are missing on the GPU machine must not stop the run.
        return call([py, "-m", "pytest", "-q", "-rs", "-m", "gpu", "--continue-on-collection-errors",
                     *collect, "tests"], env)
    if name == "compile-tests":
        return call([py, "-m", "pytest", "-q", "-rs", *(["--collect-only"] if rehearse else []),
                     "tests/test_triton_compile.py"], env)
    if name == "recipes":
        return call([py, "-m", "pytest", "-q", "-rs", *(["--collect-only"] if rehearse else []),
                     "tests/test_docs.py"], env)
    if name == "demo":
        size = ["--batch-size", "8", "--length", "24", "--no-compile"] if rehearse else []
        return call([py, "-m", "specops.demo", "--device", "cpu" if rehearse else "cuda", *size], env)
    if name == "agreement":
        return agreement(rehearse, budget_s, env)
    if name.startswith("grid-"):
        return grid(name.removeprefix("grid-"), rehearse, budget_s)
    if name == "host":
        return call([py, str(HERE / "host_overhead.py"), *(["--help"] if rehearse else [])], env)
    raise ValueError(f"unknown step {name!r}")


def call(argv: list[str], env: dict) -> int:
    print(f"$ {' '.join(argv)}", flush=True)
    return subprocess.call(argv, cwd=ROOT, env=env)


def agreement(rehearse: bool, budget_s: float, env: dict) -> int:
    """Kernel-vs-reference tokens: 1e6 requests at V of 2-3 chunks, then 1e5 at large V, then
    block verification's kernel, then the tree kernel, then the traversal kernel; each run gets an equal share of what the
    step has left."""
    script = str(HERE / "measure_agreement.py")
    device = "cpu" if rehearse else "cuda"
    runs = ([["--requests", "20", "--batch", "10", "--vocab", "1100", "1200"],
             ["--requests", "10", "--batch", "10", "--vocab", "1100", "1200",
              "--verification", "block"],
             ["--requests", "10", "--batch", "10", "--vocab", "1100", "1200",
              "--verification", "tree"],
             ["--requests", "10", "--batch", "10", "--vocab", "1100", "1200",
              "--verification", "traversal"]] if rehearse else
            [["--requests", "1000000", "--batch", "20000", "--vocab", "1100", "3000"],
             ["--requests", "100000", "--batch", "1000", "--vocab", "32000", "151936"],
             ["--requests", "100000", "--batch", "2000", "--vocab", "1100", "32000",
              "--verification", "block"],
             ["--requests", "100000", "--batch", "2000", "--vocab", "1100", "32000",
              "--verification", "tree"],
             ["--requests", "100000", "--batch", "2000", "--vocab", "1100", "32000",
              "--verification", "traversal"]])
    deadline = time.monotonic() + budget_s
    rc = 0
    for i, extra in enumerate(runs):
        share = (deadline - time.monotonic()) / (len(runs) - i)
        rc |= call([sys.executable, script, "--device", device, "--max-seconds", f"{share:.0f}", *extra], env)
    return rc


# ----------------------------------------------------------------------------- the grid
def grid_points(rehearse: bool) -> list[tuple[int, int, int]]:
    """(B, N, V), the headline N = 4 first, so a truncated grid has the most useful points."""
    if rehearse:
        return [(b, 2, 1100) for b in (1, 3)]
    batches = (1, 16, 64, 256, 257, 384, 600, 1024)
    return [(b, n, v) for n in (4, 1, 8) for v in (32000, 128256, 151936) for b in batches]


def grid(dtype_name: str, rehearse: bool, budget_s: float) -> int:
    # specops (and Triton with it) is imported here, in the step's own process, whose environment
    # the entry set (TRITON_INTERPRET on a rehearsal).
    import specops  # noqa: F401  (registers torch.ops.specops.chain_speculative_sampling)

    deadline = time.monotonic() + budget_s
    device = torch.device("cpu" if rehearse else "cuda")
    dtype = DTYPES[dtype_name]
    graphs = can_graph(device)
    if not graphs:
        print(f"CUDA-graph timings skipped: no CUDA graphs on {device.type} (columns left empty)", flush=True)
    copy_bw = copy_bandwidth(device, 8 if rehearse else 1024)
    print(f"copy bandwidth on {device}: {copy_bw / 1e9:.1f} GB/s (read + write)", flush=True)
    gen = torch.Generator(device=device).manual_seed(0)
    max_bytes = 2**20 if rehearse else 24 * 2**30  # inputs held at once
    path = out_dir() / "grid.csv"
    fields = ["dtype", "B", "N", "V", "programs", "copies", "needed_MB", "ours_eager_us", "base_eager_us",
              "speedup_eager", "ours_graph_us", "base_graph_us", "speedup_graph", "graph_TBps",
              "fraction_of_copy", "copy_TBps", "device"]
    new_file = not path.exists()
    with path.open("a", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=fields)
        if new_file:
            writer.writeheader()
        for batch, num_draft, vocab in grid_points(rehearse):
            if time.monotonic() > deadline:
                print(f"time budget spent: the {dtype_name} grid stops before B={batch} N={num_draft} V={vocab}",
                      flush=True)
                return 0
            row = measure_point(batch, num_draft, vocab, dtype, device, gen, max_bytes, graphs)
            row.update(dtype=dtype_name, fraction_of_copy=fmt(row.pop("achieved") / copy_bw),
                       copy_TBps=fmt(copy_bw / 1e12), device=device.type)
            writer.writerow(row)
            f.flush()
            print(json.dumps(row), flush=True)
    return 0


def fmt(value: float) -> str:
    return "" if value is None or math.isnan(value) else f"{value:.4g}"


def planned_programs(batch: int, num_draft: int, vocab: int, dtype) -> int | str:
    """Programs per request the token launcher's plan gives this point ('' without a compiled
    kernel: under the interpreter)."""
    from specops.chain.token import launch
    from specops.core.launch import occupancy

    for (_, constexprs, dtypes), kernel in launch.MAIN._resources.items():
        constexprs = dict(constexprs)
        if (constexprs["HAS_DRAFT"] and constexprs["BLOCK_N"] == launch.block_n(num_draft)
                and dtypes[0] == dtype):  # the target's
            return occupancy.programs_per_row(kernel, batch, -(-vocab // launch.CHUNK_SIZE),
                                              launch.CHUNK_SIZE * dtype.itemsize,
                                              launch.MAX_PROGRAMS_PER_REQUEST)
    return ""


def measure_point(batch, num_draft, vocab, dtype, device, gen, max_bytes, graphs) -> dict:
    """One grid point: our op and the eager baseline, eagerly and (on CUDA) under graph replay."""
    one_set = batch * (2 * num_draft + 1) * vocab * torch.finfo(dtype).bits // 8
    copies = max(1, min(16, -(-2 * L2_BYTES // one_set), max_bytes // one_set))
    sets = [make_inputs(batch, num_draft, vocab, dtype, device, gen) for _ in range(copies)]
    seed = torch.tensor([1234], device=device)
    offset = torch.tensor([0], device=device)
    accepted = torch.zeros(batch, dtype=torch.int32, device=device)
    emitted = torch.zeros(batch, dtype=torch.int32, device=device)

    def ours(i):
        draft, ids, target = sets[i]
        return torch.ops.specops.chain_speculative_sampling(draft, ids, target, accepted, emitted, seed, offset)

    def base(i):
        return eager_chain_sampling(*sets[i])

    draft, ids, target = sets[0]
    moved = needed_bytes(batch, num_draft, vocab, dtype, output=ours(0), id_bytes=ids.element_size())
    reps = dict(min_time=0.05, max_reps=5 if device.type == "cpu" else 200)
    ours_eager = time_eager(ours, copies, device, **reps)
    base_eager = try_time(lambda: time_eager(base, copies, device, **reps), "eager baseline, eager")
    ours_graph = base_graph = float("nan")
    if graphs:
        torch.cuda.empty_cache()  # the graphs' private pools cannot reuse the input generation's blocks
        ours_graph = try_time(lambda: time_graph(ours, copies, device), "our op, graph")
        # The baseline's temporaries are a few times its inputs; past ~32 GiB they would crowd the card.
        if 4 * batch * (num_draft + 1) * vocab * 4 < 32 * 2**30:
            base_graph = try_time(lambda: time_graph(base, copies, device), "eager baseline, graph")
    del sets
    if device.type == "cuda":
        torch.cuda.empty_cache()
    best = ours_graph if graphs else ours_eager
    return {
        "B": batch, "N": num_draft, "V": vocab, "programs": planned_programs(batch, num_draft, vocab, dtype), "copies": copies,
        "needed_MB": fmt(moved / 1e6), "ours_eager_us": fmt(ours_eager * 1e6),
        "base_eager_us": fmt(base_eager * 1e6), "speedup_eager": fmt(base_eager / ours_eager),
        "ours_graph_us": fmt(ours_graph * 1e6), "base_graph_us": fmt(base_graph * 1e6),
        "speedup_graph": fmt(base_graph / ours_graph), "graph_TBps": fmt(moved / ours_graph / 1e12),
        "achieved": moved / best,
    }


def try_time(measure, what: str) -> float:
    """A timing, or NaN (with a note) when it fails, e.g. out of memory: the other points still run."""
    try:
        return measure()
    except RuntimeError as exc:  # torch.OutOfMemoryError is a RuntimeError
        print(f"{what} failed: {str(exc).splitlines()[0]}", flush=True)
        return float("nan")


if __name__ == "__main__":
    sys.exit(main())
