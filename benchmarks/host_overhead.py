"""Host time of one call of token verification: the public function, the registered op, the public
function inside ``torch.compile`` and under CUDA-graph replay, against a bare ``kernel[grid]``
launch of the same kernel with the arguments the launcher passes it.

    python benchmarks/host_overhead.py [--batch 16 --num-draft 4 --vocab 32000 --rounds 40]

Host time is what the Python thread spends per call; the GPU work is queued, not waited for. Each
round times every entry over ``--calls`` calls, in a new order each round, and the best round of
each is kept (the least disturbed by other processes). The process runs on one CPU core with one
torch thread (``--unpinned``: on every core, with torch's threads), so that every entry runs under
the same core's conditions. With CUDA the real driver launches the real kernels; without it the
stand-in driver (tests/standin_driver.py) runs Triton's launch path on CPU tensors up to the driver's
launcher, so the figures leave out the CUDA launcher's own work, and CUDA-graph replay is skipped.
"""

from __future__ import annotations

import argparse
import os
import random
import sys
import time

import torch

HAS_CUDA = torch.cuda.is_available()
if not HAS_CUDA:
    os.environ.pop("TRITON_INTERPRET", None)
    sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))),
                                    "tests"))
    import standin_driver  # tests/standin_driver.py, a test double of Triton's CUDA driver

    DRIVER = standin_driver.install()
else:
    DRIVER = None
os.environ["SPECOPS_BACKEND"] = "triton"  # CPU tensors too, with the stand-in driver

import triton  # noqa: E402

import specops  # noqa: E402
from specops.chain.token import launch  # noqa: E402

from common import captured  # noqa: E402  (benchmarks/common.py, beside this script)

BARE = "kernel[grid], same kernel"
OP = torch.ops.specops.chain_speculative_sampling


def bare_launch(call):
    """A bare ``kernel[grid]`` launch of the token kernel with the grid and arguments the launcher
    passes it in ``call()`` (recorded from a call after a first one has made the launch plan)."""
    call()
    seen = []
    kernel = launch.MAIN.fn

    class Recorder:
        def __getitem__(self, grid):
            return lambda *args, **kwargs: seen.append((grid, args, kwargs))

    launch.MAIN.fn = Recorder()
    try:
        call()
    finally:
        launch.MAIN.fn = kernel
    ((grid, args, kwargs),) = seen
    return lambda: kernel[grid](*args, **kwargs)


def make_entries(batch, num_draft, vocab, device):
    gen = torch.Generator(device=device).manual_seed(0)
    target = torch.rand(batch, num_draft + 1, vocab, generator=gen, device=device)
    draft = torch.rand(batch, num_draft, vocab, generator=gen, device=device)
    ids = torch.randint(0, vocab, (batch, num_draft), generator=gen, device=device)
    acc = torch.zeros(batch, dtype=torch.int32, device=device)
    emit = torch.zeros(batch, dtype=torch.int32, device=device)
    seed = torch.tensor([1234], device=device)
    offset = torch.tensor([0], device=device)
    public = specops.chain_speculative_sampling

    def step(draft, ids, target, acc, emit, seed, offset):
        return public(draft, ids, target, acc, emit, seed=seed, offset=offset)[0]

    compiled = torch.compile(step, fullgraph=True)
    args = (draft, ids, target, acc, emit, seed, offset)
    entries = {
        BARE: bare_launch(lambda: step(*args)),
        "public function, seed tensor": lambda: step(*args),
        "public function, seed int": lambda: public(draft, ids, target, acc, emit, seed=1234),
        "registered op": lambda: OP(*args),
        "public function, torch.compile": lambda: compiled(*args),
    }
    if device.type == "cuda":  # a replay's host time: the graph holds the launches alone
        entries["public function, CUDA graph replay"] = captured(lambda: step(*args)).replay
    return entries


def sync(device):
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def measure(batch=16, num_draft=4, vocab=32000, rounds=40, calls=200, seed=0):
    """{entry: best seconds per call} and the modules loaded after warm-up (None with CUDA)."""
    device = torch.device("cuda" if HAS_CUDA else "cpu")
    entries = make_entries(batch, num_draft, vocab, device)
    for fn in entries.values():  # warm-up: compile and load every specialisation
        fn()
        fn()
    sync(device)
    loaded = DRIVER.utils.modules_loaded if DRIVER else None
    best = {name: float("inf") for name in entries}
    order = list(entries)
    shuffle = random.Random(seed)
    for _ in range(rounds):
        shuffle.shuffle(order)
        for name in order:
            fn = entries[name]
            sync(device)
            start = time.perf_counter()
            for _ in range(calls):
                fn()
            best[name] = min(best[name], (time.perf_counter() - start) / calls)
    sync(device)
    after = DRIVER.utils.modules_loaded - loaded if DRIVER else None
    return best, after


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--batch", type=int, default=16)
    parser.add_argument("--num-draft", type=int, default=4)
    parser.add_argument("--vocab", type=int, default=32000)
    parser.add_argument("--rounds", type=int, default=40)
    parser.add_argument("--calls", type=int, default=200)
    parser.add_argument("--unpinned", action="store_true",
                        help="run on every core, with torch's threads (default: one core, one "
                             "thread)")
    args = parser.parse_args(argv)
    pinned = not args.unpinned and hasattr(os, "sched_setaffinity")  # Linux
    if pinned:
        os.sched_setaffinity(0, {max(os.sched_getaffinity(0))})
        torch.set_num_threads(1)
    best, loaded_after_warmup = measure(args.batch, args.num_draft, args.vocab, args.rounds,
                                        args.calls)
    unit = best[BARE]
    where = ("CUDA, real driver: " + torch.cuda.get_device_name() if HAS_CUDA
             else "no GPU: stand-in driver (Triton's launch path up to the driver's launcher)")
    print(f"host time per call, B={args.batch} N={args.num_draft} V={args.vocab}; {where}")
    print(f"torch {torch.__version__}, triton {triton.__version__}; best of {args.rounds} "
          f"interleaved rounds of {args.calls} calls, "
          f"{'on one CPU core' if pinned else 'unpinned'}")
    print(f"{'entry':36s} {'us':>8s} {'x bare':>8s}")
    for name, seconds in best.items():
        print(f"{name:36s} {seconds * 1e6:8.1f} {seconds / unit:8.1f}")
    if not HAS_CUDA:
        print("public function, CUDA graph replay: skipped (no GPU)")
    if loaded_after_warmup is not None:
        print(f"modules loaded after warm-up: {loaded_after_warmup}")
    return best


if __name__ == "__main__":
    sys.exit(main() and 0)
