"""A flattened batch verified as it is (``specops.varlen``) against what an engine does without
it: pad the batch to (B, max + 1, V), then the padded call; and the padded call alone (its input
already padded), and the memory floor. Mixed lengths (N_b drawn from 0..max) and uniform ones.

    python benchmarks/varlen.py                          # CPU: B = 16, max 4, V = 32000
    python benchmarks/varlen.py --device cuda --batch 256 --vocab 128256

Printed per point: median microseconds per call of each way, the ratio of the padded way to the
flattened one, and the floor: the bytes the call must read (the rows at each request's first
rejection and its drafts' values, from the padded call's output) over the measured copy
bandwidth. On a CPU the backends pad too (docs/internals/decisions.md, "Flattened batches"), so
the two ways cost about the same there; on a GPU the kernels read the flattened rows in place.
"""

from __future__ import annotations

import argparse
import os
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from common import (DTYPES, add_threads_option, copy_bandwidth, describe_device,  # noqa: E402
                    needed_bytes, require_device, time_eager, use_threads)

import specops  # noqa: E402
import specops.varlen  # noqa: E402


def flattened_inputs(counts: list[int], vocab: int, dtype, device, gen):
    """(draft rows (T, V), ids (T,), target rows (T + B, V), cu (B + 1,)) on ``device``."""
    batch, num_tokens = len(counts), sum(counts)
    target = (torch.randn(num_tokens + batch, vocab, generator=gen) * 3).softmax(-1)
    draft = (torch.randn(num_tokens, vocab, generator=gen) * 3).softmax(-1)
    ids = torch.multinomial(draft, 1, generator=gen).reshape(-1) if num_tokens else \
        torch.empty(0, dtype=torch.int64)
    cu = torch.tensor([0] + counts).cumsum(0)
    return (draft.to(device, dtype), ids.to(device), target.to(device, dtype), cu.to(device))


def padded_rows(counts: list[int], most: int, device):
    """The gathers an engine's padding does: (B, most + 1) target-row and (B, most) draft-row
    indices, and the (B, most) mask of real drafts."""
    rows_t, rows_d, real = [], [], []
    start, last = 0, max(sum(counts) - 1, 0)
    for b, n in enumerate(counts):
        rows_t.append([start + b + min(t, n) for t in range(most + 1)])
        rows_d.append([min(start + min(j, max(n - 1, 0)), last) for j in range(most)])
        real.append([j < n for j in range(most)])
        start += n
    return (torch.tensor(rows_t, device=device), torch.tensor(rows_d, device=device),
            torch.tensor(real, device=device))


def point(counts, most, vocab, dtype, device, verification, gen, bandwidth):
    draft, ids, target, cu = flattened_inputs(counts, vocab, dtype, device, gen)
    rows_t, rows_d, real = padded_rows(counts, most, device)
    seed = torch.arange(len(counts), device=device)

    def pad():
        if ids.numel() == 0:
            return None, torch.full(real.shape, -1, device=device), target[rows_t]
        return draft[rows_d], torch.where(real, ids[rows_d], -1), target[rows_t]

    padded = pad()

    def flattened_call(i):
        return specops.varlen.chain_speculative_sampling(draft, ids, target, cu, most, seed=seed,
                                                         verification=verification)

    def pad_and_call(i):
        return specops.chain_speculative_sampling(*pad(), seed=seed, verification=verification)

    def padded_call(i):
        return specops.chain_speculative_sampling(*padded, seed=seed, verification=verification)

    times = {name: time_eager(fn, 1, device) for name, fn in (
        ("flattened", flattened_call), ("pad + padded", pad_and_call),
        ("padded alone", padded_call))}
    output = padded_call(0)[0]
    floor = needed_bytes(len(counts), most, vocab, dtype, output=output) / bandwidth
    return times, floor


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--batch", type=int, default=16)
    parser.add_argument("--max-drafts", type=int, default=4)
    parser.add_argument("--vocab", type=int, default=32000)
    parser.add_argument("--dtype", choices=sorted(DTYPES), default="float32")
    parser.add_argument("--verification", choices=("token", "block"), nargs="+",
                        default=["token", "block"])
    add_threads_option(parser)
    args = parser.parse_args(argv)
    device = require_device(args.device)
    use_threads(parser, args.threads, device)
    dtype = DTYPES[args.dtype]
    gen = torch.Generator().manual_seed(0)
    bandwidth = copy_bandwidth(device, megabytes=64)
    print(f"# {describe_device(device)}, torch {torch.__version__}; B = {args.batch}, max "
          f"{args.max_drafts} drafts, V = {args.vocab}, {args.dtype}; copy bandwidth "
          f"{bandwidth / 1e9:.1f} GB/s")
    print(f"{'lengths':<8} {'verify':<6} {'flattened us':>13} {'pad + padded us':>16} "
          f"{'padded alone us':>16} {'pad+padded / flat':>18} {'floor us':>9}")
    mixed = torch.randint(0, args.max_drafts + 1, (args.batch,), generator=gen).tolist()
    for name, counts in (("mixed", mixed), ("uniform", [args.max_drafts] * args.batch)):
        for verification in args.verification:
            times, floor = point(counts, args.max_drafts, args.vocab, dtype, device, verification,
                                 gen, bandwidth)
            flat, padded, alone = (times[k] * 1e6 for k in ("flattened", "pad + padded",
                                                              "padded alone"))
            print(f"{name:<8} {verification:<6} {flat:>13.1f} {padded:>16.1f} {alone:>16.1f} "
                  f"{padded / flat:>18.2f} {floor * 1e6:>9.1f}")


if __name__ == "__main__":
    main()
