"""Vocabulary-parallel verification against all-gather + the single-device call, per call.

    python benchmarks/vocab_parallel.py            # 2 gloo ranks on CPU: performance.md's table
    python benchmarks/vocab_parallel.py --quick    # a small size, a few seconds

Both sides start from each rank's shards, (B, N + 1, V / 2) target and (B, N, V / 2) draft
probabilities. "all-gather + single device" all-gathers the shards into the full rows (what
engines do today) and runs specops.chain_speculative_sampling; "vocab-parallel" runs
specops.distributed's. Reported per call: the median over the repetitions of the slower rank's
time, and the bytes each rank hands to collectives (its
own tensors; an all-gather then delivers world - 1 times that to every rank), recorded by wrapping
torch.distributed's functions.
"""

from __future__ import annotations

import argparse
import datetime
import os
import statistics
import sys
import tempfile
import time

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

WORLD = 2
SHAPES = [(8, 4, 32768), (64, 4, 32768), (8, 4, 131072), (64, 4, 152064)]
QUICK_SHAPES = [(4, 3, 8192)]


def sent_bytes(call) -> tuple[object, int, int]:
    """(result, bytes this rank handed to collectives, number of collectives) of one call."""
    log = []
    saved = {name: getattr(dist, name) for name in ("all_gather", "all_reduce", "broadcast")}

    def wrap(function):
        def recording(*args, **kwargs):
            tensor = args[1] if isinstance(args[0], list) else args[0]
            log.append(tensor.numel() * tensor.element_size())
            return function(*args, **kwargs)
        return recording

    for name, function in saved.items():
        setattr(dist, name, wrap(function))
    try:
        result = call()
    finally:
        for name, function in saved.items():
            setattr(dist, name, function)
    return result, sum(log), len(log)


def gathered(shard: torch.Tensor) -> torch.Tensor:
    parts = [torch.empty_like(shard) for _ in range(WORLD)]
    dist.all_gather(parts, shard.contiguous())
    return torch.cat(parts, dim=-1)


def worker(rank: int, store: str, shapes: list, reps: int, queue) -> None:
    dist.init_process_group("gloo", init_method=f"file://{store}", rank=rank, world_size=WORLD,
                            timeout=datetime.timedelta(seconds=120))
    torch.set_num_threads(1)  # one core per rank
    import specops
    import specops.distributed as sd

    rows = []
    for batch, num_draft, vocab in shapes:
        g = torch.Generator().manual_seed(0)
        width = vocab // WORLD
        target = torch.softmax(torch.randn(batch, num_draft + 1, width, generator=g), -1)
        draft = torch.softmax(torch.randn(batch, num_draft, width, generator=g), -1)
        ids = torch.randint(0, vocab, (batch, num_draft), generator=g)
        start = rank * width
        calls = {
            "all-gather + single device": lambda: specops.chain_speculative_sampling(
                gathered(draft), ids, gathered(target), seed=1),
            "vocab-parallel": lambda: sd.chain_speculative_sampling(
                draft, ids, target, seed=1, vocab_start=start, vocab_size=vocab),
        }
        for name, call in calls.items():
            _, moved, count = sent_bytes(call)
            times = []
            for _ in range(reps):
                dist.barrier()
                begin = time.perf_counter()
                call()
                times.append(time.perf_counter() - begin)
            rows.append((batch, num_draft, vocab, name, times, moved, count))
    queue.put((rank, rows))
    dist.destroy_process_group()


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="one small shape, 3 repetitions")
    parser.add_argument("--reps", type=int, default=10, help="timed calls per shape (default 10)")
    args = parser.parse_args(argv)
    if args.reps < 1:
        parser.error("--reps must be >= 1")
    shapes, reps = (QUICK_SHAPES, 3) if args.quick else (SHAPES, args.reps)
    context = mp.get_context("spawn")
    queue = context.Queue()
    with tempfile.TemporaryDirectory() as tmp:
        processes = [context.Process(target=worker, args=(r, os.path.join(tmp, "store"), shapes,
                                                          reps, queue)) for r in range(WORLD)]
        for p in processes:
            p.start()
        results = dict(queue.get(timeout=1800) for _ in processes)
        for p in processes:
            p.join(60)
    print(f"{WORLD} gloo ranks on CPU, torch {torch.__version__}; per call, median of {reps}")
    print("| B | N | V | method | ms per call | bytes sent per rank | collectives |")
    print("| ---: | ---: | ---: | --- | ---: | ---: | ---: |")
    for index, (batch, num_draft, vocab, name, _, moved, count) in enumerate(results[0]):
        slowest = [max(results[r][index][4][i] for r in results) for i in range(reps)]
        milliseconds = statistics.median(slowest) * 1e3
        print(f"| {batch} | {num_draft} | {vocab} | {name} | {milliseconds:.2f} | {moved:,} "
              f"| {count} |")


if __name__ == "__main__":
    sys.exit(main())
