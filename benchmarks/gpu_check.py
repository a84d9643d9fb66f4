"""One script for a GPU session (~10 minutes on an H200): the GPU tests, then the benchmark grid of
issue 3 item 7 under CUDA-graph replay.

    OUT=results python benchmarks/gpu_check.py [--quick] [--skip-tests]

Writes $OUT/gpu_tests.txt, $OUT/agreement.jsonl (kernel vs reference tokens over 1e6 requests),
$OUT/bench.csv and $OUT/bench.md (date, GPU, versions, table).
Per configuration: latency (median over graph replays), the bytes the op needs (SPEC.md
performance model: 2N gathered scalars, p_e, and q_e when a draft row is rejected, all measured
from the actual e of every request), achieved bandwidth on those bytes as a fraction of a measured
device-to-device copy, and the speed-up over a straightforward eager-torch implementation
(benchmark.py's run_eager: the residual at every position, then the row at e; timed eagerly).
Input buffers rotate between replays (several copies captured in one graph) so the L2 cache does
not flatter the kernel.
"""

from __future__ import annotations

import argparse
import csv
import datetime
import os
import subprocess
import sys
import time

import torch

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

import specops  # noqa: E402
from benchmark import run_eager  # noqa: E402  (benchmarks/benchmark.py: the one eager baseline)
from specops.chain.launch import choose_num_splits  # noqa: E402

BATCHES = (1, 16, 64, 256, 1024)
DRAFTS = (1, 4, 8)
VOCABS = (32000, 128256, 151936)
DTYPES = (torch.float32, torch.bfloat16)
L2_BYTES = 60 * 2**20  # H100/H200 L2 is 50-60 MB: rotate through more than this


def graph_time_us(fn, copies, repeats):
    """Median us per call of fn(i) over graph replays; the graph runs fn(0..copies-1) in turn."""
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        for i in range(copies):
            fn(i)
    torch.cuda.current_stream().wait_stream(stream)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        for i in range(copies):
            fn(i)
    graph.replay()
    torch.cuda.synchronize()
    times = []
    for _ in range(repeats):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        graph.replay()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end) * 1e3 / copies)
    times.sort()
    del graph
    return times[len(times) // 2]


def eager_time_us(fn, copies, repeats):
    """Median us per call of fn(i), launched eagerly (torch.multinomial and the eager
    temporaries are not meant for graph capture, and a failed capture would poison the stream)."""
    for i in range(copies):  # warm-up
        fn(i)
    torch.cuda.synchronize()
    times = []
    for _ in range(repeats):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        for i in range(copies):
            fn(i)
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end) * 1e3 / copies)
    times.sort()
    return times[len(times) // 2]


def copy_bandwidth():
    """Device-to-device copy bandwidth (read + write bytes per second) on 1 GiB."""
    src = torch.empty(2**30, dtype=torch.uint8, device="cuda")
    dst = torch.empty_like(src)
    us = graph_time_us(lambda i: dst.copy_(src), 1, 20)
    return 2 * src.numel() / (us * 1e-6)


def make_copies(batch, num_draft, vocab, dtype, copies, gen):
    sets = []
    for _ in range(copies):
        target = torch.rand(batch, num_draft + 1, vocab, device="cuda", generator=gen, dtype=torch.float32)
        target = (target / target.sum(-1, keepdim=True)).to(dtype)
        draft = torch.rand(batch, num_draft, vocab, device="cuda", generator=gen, dtype=torch.float32)
        draft = (draft / draft.sum(-1, keepdim=True)).to(dtype)
        ids = torch.randint(0, vocab, (batch, num_draft), device="cuda", generator=gen)
        sets.append((draft, ids, target))
    return sets


def needed_bytes(draft, ids, target, seed, offset):
    """SPEC.md's minimum for this input: measured from each request's actual e."""
    batch, num_draft = ids.shape
    vocab, esize = target.shape[2], target.element_size()
    acc = torch.zeros(batch, dtype=torch.int32, device="cuda")
    emit = torch.zeros(batch, dtype=torch.int32, device="cuda")
    torch.ops.specops.chain_speculative_sampling(draft, ids, target, acc, emit, seed, offset)
    rejected_rows = int((emit < num_draft).sum())
    return (batch * num_draft * (2 * esize + ids.element_size())  # ids, p_j[d_j], q_j[d_j]
            + (batch + rejected_rows) * vocab * esize  # p_e, and q_e when rejecting
            + batch * (num_draft + 1) * 4)  # output


def run_grid(args):
    copy_bw = copy_bandwidth()
    print(f"device-to-device copy: {copy_bw / 1e12:.2f} TB/s (read + write)", flush=True)
    gen = torch.Generator(device="cuda").manual_seed(0)
    rows = []
    grid = [(b, n, v, d) for d in DTYPES for v in VOCABS for n in DRAFTS for b in BATCHES]
    if args.quick:
        grid = [g for g in grid if g[1] != 4 and g[2] != 128256]
    deadline = time.time() + args.budget_s
    for batch, num_draft, vocab, dtype in grid:
        if time.time() > deadline:
            print("time budget spent: grid truncated", flush=True)
            break
        one = batch * (2 * num_draft + 1) * vocab * (4 if dtype == torch.float32 else 2)
        copies = max(2, min(16, -(-2 * L2_BYTES // max(one, 1))))
        if copies * one > args.max_bytes:
            copies = max(1, args.max_bytes // one)
        sets = make_copies(batch, num_draft, vocab, dtype, copies, gen)
        seed = torch.tensor([1234], device="cuda")
        offset = torch.tensor([0], device="cuda")
        acc = torch.zeros(batch, dtype=torch.int32, device="cuda")
        emit = torch.zeros(batch, dtype=torch.int32, device="cuda")

        def ours(i):
            draft, ids, target = sets[i]
            return torch.ops.specops.chain_speculative_sampling(draft, ids, target, acc, emit, seed, offset)

        def eager(i):
            draft, ids, target = sets[i]
            return run_eager(draft, ids, target, None)

        us = graph_time_us(ours, copies, args.repeats)
        try:
            eager_us = eager_time_us(eager, copies, max(3, args.repeats // 4))
        except RuntimeError as exc:  # e.g. out of memory for the eager temporaries
            print(f"eager failed: {exc}", flush=True)
            eager_us = float("nan")
        nbytes = needed_bytes(*sets[0], seed, offset)
        row = {
            "dtype": str(dtype).replace("torch.", ""), "B": batch, "N": num_draft, "V": vocab,
            "splits": choose_num_splits(batch, vocab), "latency_us": round(us, 2),
            "needed_MB": round(nbytes / 1e6, 3), "bandwidth_TBps": round(nbytes / us / 1e6, 3),
            "fraction_of_copy": round(nbytes / (us * 1e-6) / copy_bw, 3),
            "eager_us": round(eager_us, 2), "speedup_vs_eager": round(eager_us / us, 2),
        }
        rows.append(row)
        print(row, flush=True)
        del sets
        torch.cuda.empty_cache()
    return rows, copy_bw


def agreement(out_dir):
    """Kernel-vs-reference token agreement (issue 3 item 3): 1e6 requests at V of 2-3 chunks,
    1e5 at large vocabularies; the JSON progress lines go to $OUT/agreement.jsonl."""
    script = os.path.join(ROOT, "benchmarks", "measure_agreement.py")
    with open(os.path.join(out_dir, "agreement.jsonl"), "w") as log:
        for extra in (["--requests", "1000000", "--batch", "20000", "--vocab", "1100", "3000"],
                      ["--requests", "100000", "--batch", "1000", "--vocab", "32000", "151936"]):
            start = time.time()
            proc = subprocess.run([sys.executable, script, "--device", "cuda", *extra],
                                  capture_output=True, text=True, cwd=ROOT)
            log.write(proc.stdout + proc.stderr)
            last = (proc.stdout.strip().splitlines() or [proc.stderr[-500:]])[-1]
            print(f"agreement {' '.join(extra)}: {last} ({time.time() - start:.0f} s)", flush=True)


def versions():
    props = torch.cuda.get_device_properties(0)
    import triton

    return (f"{datetime.date.today()} | {props.name} ({props.multi_processor_count} SMs) | "
            f"torch {torch.__version__} | triton {triton.__version__} | CUDA {torch.version.cuda}")


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    parser.add_argument("--quick", action="store_true", help="a third of the grid")
    parser.add_argument("--skip-tests", action="store_true")
    parser.add_argument("--skip-agreement", action="store_true")
    parser.add_argument("--repeats", type=int, default=20)
    parser.add_argument("--budget-s", type=float, default=360.0, help="stop the grid after this")
    parser.add_argument("--max-bytes", type=int, default=24 * 2**30, help="inputs held at once")
    args = parser.parse_args()
    out_dir = os.environ.get("OUT", os.path.join(os.getcwd(), "results"))
    os.makedirs(out_dir, exist_ok=True)
    assert torch.cuda.is_available(), "this script needs a CUDA device"
    os.environ.pop("TRITON_INTERPRET", None)
    header = versions()
    print(header, flush=True)

    if not args.skip_tests:
        start = time.time()
        proc = subprocess.run([sys.executable, "-m", "pytest", "-q", "-rs",
                               os.path.join(ROOT, "tests", "test_gpu.py"),
                               os.path.join(ROOT, "tests", "test_triton_compile.py"),
                               # GPU doc recipes, and the demo with its CUDA graph
                               os.path.join(ROOT, "tests", "test_docs.py")],
                              capture_output=True, text=True, cwd=ROOT)
        with open(os.path.join(out_dir, "gpu_tests.txt"), "w") as f:
            f.write(header + "\n" + proc.stdout + proc.stderr)
        print(proc.stdout[-3000:], f"(tests: {time.time() - start:.0f} s)", flush=True)

    if not args.skip_agreement:
        agreement(out_dir)
    rows, copy_bw = run_grid(args)
    if not rows:
        return
    with open(os.path.join(out_dir, "bench.csv"), "w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=list(rows[0]))
        writer.writeheader()
        writer.writerows(rows)
    with open(os.path.join(out_dir, "bench.md"), "w") as f:
        f.write(f"{header} | copy {copy_bw / 1e12:.2f} TB/s (read+write)\n\n")
        f.write("| " + " | ".join(rows[0]) + " |\n|" + "---|" * len(rows[0]) + "\n")
        for row in rows:
            f.write("| " + " | ".join(str(v) for v in row.values()) + " |\n")
    print(open(os.path.join(out_dir, "bench.md")).read())


if __name__ == "__main__":
    main()
