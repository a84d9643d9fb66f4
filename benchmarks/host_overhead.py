"""Host time of one call: the public function, the registered op and the pieces of the GPU path,
against a bare three-argument Triton launch (the unit).

    python benchmarks/host_overhead.py [--batch 16 --num-draft 4 --vocab 32000 --rounds 40]

Host time is what the Python thread spends per call; the GPU work is queued, not waited for. Each
round times every entry over ``--calls`` calls, in a new order each round, and the best round of
each is kept (the least disturbed by other processes). The process runs on one CPU core with one
torch thread (``--unpinned``: on every core, with torch's threads), so that every entry runs under
the same core's conditions. With CUDA the real driver launches the real kernels; without it the
stand-in driver (standin_driver.py) runs Triton's launch path up to the final C call on CPU
tensors, so the figures are the GPU path's host time less that call.
"""

from __future__ import annotations

import argparse
import os
import random
import sys
import time

HAS_CUDA = False
try:
    import torch

    HAS_CUDA = torch.cuda.is_available()
except ImportError:  # pragma: no cover
    raise

if not HAS_CUDA:
    os.environ.pop("TRITON_INTERPRET", None)
    import standin_driver  # a script's own folder is on sys.path

    DRIVER = standin_driver.install()
else:
    DRIVER = None
os.environ["SPECOPS_BACKEND"] = "triton"  # CPU tensors too, with the stand-in driver

import triton  # noqa: E402
import triton.language as tl  # noqa: E402

import specops  # noqa: E402
from specops.api import PUBLIC_NAMES  # noqa: E402
from specops.chain.token import launch  # noqa: E402
from specops.chain.token.launch import chain_speculative_sampling_triton  # noqa: E402
from specops.chain.arguments import check_arguments, check_counters_apart  # noqa: E402
from specops.core.seeding import resolve_seed_and_offset  # noqa: E402

from common import captured  # noqa: E402  (benchmarks/common.py, beside this script)

OP = torch.ops.specops.chain_speculative_sampling


@triton.jit
def bare_kernel(x_ptr, y_ptr, n):
    """The unit: a launch of three arguments that does next to nothing."""
    i = tl.program_id(0)
    tl.store(y_ptr + i, tl.load(x_ptr + i) + n)


def make_entries(batch, num_draft, vocab, device):
    gen = torch.Generator(device=device).manual_seed(0)
    target = torch.rand(batch, num_draft + 1, vocab, generator=gen, device=device)
    draft = torch.rand(batch, num_draft, vocab, generator=gen, device=device)
    ids = torch.randint(0, vocab, (batch, num_draft), generator=gen, device=device)
    acc = torch.zeros(batch, dtype=torch.int32, device=device)
    emit = torch.zeros(batch, dtype=torch.int32, device=device)
    seed = torch.tensor([1234], device=device)
    offset = torch.tensor([0], device=device)
    x = torch.zeros(16, device=device)
    y = torch.zeros(16, device=device)
    tensors = dict(draft_probs=draft, draft_token_ids=ids, target_probs=target, accepted_num=acc,
                   emitted_num=emit, seed=seed, offset=offset)
    public = specops.chain_speculative_sampling

    def step(*args):
        return public(*args[:5], seed=args[5], offset=args[6])[0]

    # What a torch.compile'd step pays per call: its guards and wrappers, and the registered op,
    # which is what the compiled graph calls.
    compiled = torch.compile(step, fullgraph=True)
    entries = {
        "bare launch (unit)": lambda: bare_kernel[(1,)](x, y, 3),
        "public, torch.compile (inductor)": lambda: compiled(draft, ids, target, acc, emit, seed,
                                                             offset),
        "public, seed tensor": lambda: public(draft, ids, target, acc, emit, seed=seed, offset=offset),
        "public, seed int": lambda: public(draft, ids, target, acc, emit, seed=1234),
        "public, seed None": lambda: public(draft, ids, target, acc, emit),
        "registered op": lambda: OP(draft, ids, target, acc, emit, seed, offset),
        "piece: launcher alone": lambda: chain_speculative_sampling_triton(
            draft, ids, target, acc, emit, seed, offset),
        "piece: argument checks": lambda: (check_arguments(names=PUBLIC_NAMES, **tensors),
                                           check_counters_apart(accepted_num=acc,
                                                                emitted_num=emit)),
        "piece: seed int -> tensors": lambda: resolve_seed_and_offset(1234, None, None, device),
        "piece: seed None -> tensors": lambda: resolve_seed_and_offset(None, None, None, device),
        "piece: one launch, loaded kernel": launch_of(draft, ids, target, acc, emit, seed, offset),
        "piece: output allocation": lambda: torch.empty((batch, num_draft + 1), dtype=torch.int32,
                                                        device=device),
    }
    if device.type == "cuda":  # a replay's host time: the graph holds the launches alone
        entries["public, CUDA graph replay"] = captured(
            lambda: step(draft, ids, target, acc, emit, seed, offset)).replay
    return entries


def launch_of(*args):
    """A call of the main kernel's launch as the launcher makes it for these arguments (read from
    one call), alone: the floor of any call's host time beside the checks and the output."""
    seen = []
    real = launch.MAIN.launch
    launch.MAIN.launch = lambda *given, **options: (seen.append((given, options))
                                                    or real(*given, **options))
    try:
        chain_speculative_sampling_triton(*args)
    finally:
        launch.MAIN.launch = real
    ((launch_args, options),) = seen
    return lambda: real(*launch_args, **options)


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
    unit = best["bare launch (unit)"]
    where = ("CUDA, real driver: " + torch.cuda.get_device_name() if HAS_CUDA
             else "no GPU: stand-in driver (Triton's launch path up to the final C call)")
    print(f"host time per call, B={args.batch} N={args.num_draft} V={args.vocab}; {where}")
    print(f"torch {torch.__version__}, triton {triton.__version__}; best of {args.rounds} "
          f"interleaved rounds of {args.calls} calls, "
          f"{'on one CPU core' if pinned else 'unpinned'}")
    print(f"{'entry':32s} {'us':>8s} {'x bare':>8s}")
    for name, seconds in best.items():
        print(f"{name:32s} {seconds * 1e6:8.1f} {seconds / unit:8.1f}")
    if loaded_after_warmup is not None:
        print(f"modules loaded after warm-up: {loaded_after_warmup}")
    return best


if __name__ == "__main__":
    sys.exit(main() and 0)
