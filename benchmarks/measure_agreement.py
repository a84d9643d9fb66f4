"""Kernel-vs-reference token agreement over many random requests, for token verification (the
default), block verification (``--verification block``), tree verification (``--verification
tree``: random trees of 2-14 nodes, with or without draft probabilities and replacement) or its
traversal verification (``--verification traversal``: the same trees).

The kernel and the reference sum chunk masses (float32) and in-chunk prefix sums (float64) in a
different order, so a token can differ when two chunks' race keys lie within float32 rounding of
each other, or a uniform lands within ~1e-16 of a CDF boundary (docs/internals/kernel.md).  This script
counts such mismatches (tokens or counters) over random requests.

On CPU the kernel runs under TRITON_INTERPRET=1 (tens of ms per request), so use small vocabularies
(2-3 chunks) and run it in the background, e.g. two processes on two cores:

    nohup python benchmarks/measure_agreement.py --requests 50000 --worker 0 > /tmp/agree0.log &
    nohup python benchmarks/measure_agreement.py --requests 50000 --worker 1 > /tmp/agree1.log &

On a GPU (no interpreter) the same script runs in seconds with --device cuda.
Each progress line is JSON: requests, mismatching requests, mismatch rate so far.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import time

if __name__ == "__main__":
    _args = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    _args.add_argument("--requests", type=int, default=100_000)
    _args.add_argument("--batch", type=int, default=600, help="requests per launch")
    _args.add_argument("--worker", type=int, default=0, help="seeds the inputs; use distinct values")
    _args.add_argument("--device", default="cpu", help="cpu (interpreter) or cuda")
    _args.add_argument("--vocab", type=int, nargs=2, default=(1100, 3000), help="V range")
    _args.add_argument("--verification", choices=("token", "block", "tree", "traversal"),
                        default="token")
    _args.add_argument("--max-seconds", type=float, default=math.inf,
                       help="stop after the batch that passes this many seconds")
    ARGS = _args.parse_args()
    if ARGS.device == "cpu":
        os.environ.setdefault("TRITON_INTERPRET", "1")  # before triton is imported

import torch  # noqa: E402

from specops.chain.block.launch import block_speculative_sampling_triton  # noqa: E402
from specops.chain.block.reference import block_speculative_sampling_reference  # noqa: E402
from specops.chain.token.launch import chain_speculative_sampling_triton  # noqa: E402
from specops.chain.token.reference import chain_speculative_sampling_reference  # noqa: E402
from specops.tree.launch import tree_speculative_sampling_triton  # noqa: E402
from specops.tree.reference import tree_speculative_sampling_reference  # noqa: E402
from specops.tree.traversal_reference import verify as traversal_reference  # noqa: E402

# (reference, kernel) of each verification mode.
IMPLEMENTATIONS = {
    "token": (chain_speculative_sampling_reference, chain_speculative_sampling_triton),
    "block": (block_speculative_sampling_reference, block_speculative_sampling_triton),
}


def random_setting(gen, device, vocab_range, sizes):
    """The draws every batch starts with: V, its size (drafts or nodes, in ``sizes``), its dtype, a
    sharpness and the generator of its rows, which are drawn on the device itself (a GPU run draws
    1e6 requests in seconds)."""
    vocab = int(torch.randint(vocab_range[0], vocab_range[1] + 1, (1,), generator=gen))
    size = int(torch.randint(sizes[0], sizes[1], (1,), generator=gen))
    dtype = (torch.float32, torch.bfloat16, torch.float16)[int(torch.randint(0, 3, (1,), generator=gen))]
    sharp = float(torch.rand(1, generator=gen)) * 6.0
    dev_gen = torch.Generator(device=device).manual_seed(int(torch.randint(2**62, (1,), generator=gen)))
    return vocab, size, dtype, sharp, dev_gen


def peaked_rows(shape, sharp, dev_gen, device):
    """Rows of uniforms to the power ``sharp``, normalised: flat for a small one, peaked for a
    large one."""
    rows = torch.rand(shape, generator=dev_gen, device=device) ** sharp
    return rows / rows.sum(-1, keepdim=True)


def per_request_seeds(batch, dev_gen, device):
    seed = torch.randint(-(2**63), 2**63 - 1, (batch,), generator=dev_gen, device=device)
    offset = torch.randint(0, 2**62, (batch,), generator=dev_gen, device=device)
    return seed, offset


def random_batch(gen, batch, device, vocab_range):
    """Random request shapes and rows: peaked and flat rows, fp32/bf16, with or without drafts."""
    vocab, num_draft, dtype, sharp, dev_gen = random_setting(gen, device, vocab_range, (1, 4))
    target = peaked_rows((batch, num_draft + 1, vocab), sharp, dev_gen, device)
    draft = peaked_rows((batch, num_draft, vocab), sharp, dev_gen, device)
    ids = torch.multinomial(draft.reshape(-1, vocab), 1, generator=dev_gen).reshape(batch, num_draft)
    padded = torch.rand(batch, num_draft, generator=dev_gen, device=device) < 0.03
    ids = ids.masked_fill(padded, -1)  # some drafts end early
    use_draft = bool(torch.rand(1, generator=gen) < 0.7)
    seed, offset = per_request_seeds(batch, dev_gen, device)
    return (draft.to(dtype) if use_draft else None, ids, target.to(dtype), seed, offset)


def random_trees(gen, batch, device, vocab_range):
    """Random trees (each node's parent uniform among the nodes before it), rows as random_batch
    draws them, every node's token drawn from its parent's draft row; (draft_probs or None, ids,
    parents, target, seed, offset, with_replacement)."""
    vocab, num_nodes, dtype, sharp, dev_gen = random_setting(gen, device, vocab_range, (2, 15))
    target = peaked_rows((batch, num_nodes + 1, vocab), sharp, dev_gen, device)
    draft = 0.5 * peaked_rows((batch, num_nodes + 1, vocab), sharp, dev_gen, device) + 0.5 * target
    upper = torch.arange(1, num_nodes + 1, device=device)
    parents = (torch.rand(batch, num_nodes, generator=dev_gen, device=device) * upper).long()
    rows = draft[torch.arange(batch, device=device)[:, None], parents]
    ids = torch.multinomial(rows.reshape(-1, vocab), 1, generator=dev_gen).reshape(batch, num_nodes)
    ids = ids.masked_fill(torch.rand(batch, num_nodes, generator=dev_gen, device=device) < 0.03, -1)
    use_draft = bool(torch.rand(1, generator=gen) < 0.7)
    seed, offset = per_request_seeds(batch, dev_gen, device)
    return (draft.to(dtype) if use_draft else None, ids, parents, target.to(dtype), seed, offset,
            bool(torch.rand(1, generator=gen) < 0.5))


def tree_outputs(gen, batch, device, vocab_range, rule="token"):
    """(vocabulary, dtype, the reference's outputs, the kernel's) of one batch of random trees,
    verified by ``rule`` (token or traversal verification)."""
    *inputs, with_replacement = random_trees(gen, batch, device, vocab_range)
    # Target-only, traversal verification is the token rule (docs/tree.md).
    reference = (traversal_reference if rule == "traversal" and inputs[0] is not None
                 else tree_speculative_sampling_reference)
    return (inputs[3].shape[-1], inputs[3].dtype,
            [reference(*inputs, with_replacement),
             tree_speculative_sampling_triton(*inputs, with_replacement, rule)])


def main(args) -> None:
    gen = torch.Generator().manual_seed(1000 + args.worker)
    done = mismatched = 0
    start = time.time()
    while done < args.requests and time.time() - start < args.max_seconds:
        batch = min(args.batch, args.requests - done)
        if args.verification in ("tree", "traversal"):
            vocab, dtype, outs = tree_outputs(gen, batch, args.device, args.vocab,
                                              "token" if args.verification == "tree"
                                              else "traversal")
        else:
            draft, ids, target, seed, offset = random_batch(gen, batch, args.device, args.vocab)
            vocab, dtype, outs = target.shape[-1], target.dtype, []
            for fn in IMPLEMENTATIONS[args.verification]:
                acc = torch.zeros(batch, dtype=torch.int64, device=args.device)
                emit = torch.zeros(batch, dtype=torch.int64, device=args.device)
                outs.append((fn(draft, ids, target, acc, emit, seed, offset), acc, emit))
        differ = torch.zeros(batch, dtype=torch.bool, device=args.device)
        for a, b in zip(outs[0], outs[1]):
            differ |= (a != b).reshape(batch, -1).any(dim=1)
        done += batch
        mismatched += int(differ.sum())
        print(json.dumps({"verification": args.verification, "worker": args.worker, "requests": done, "mismatched": mismatched,
                          "rate": mismatched / done, "seconds": round(time.time() - start, 1),
                          "vocab": vocab, "dtype": str(dtype)}), flush=True)


if __name__ == "__main__":
    main(ARGS)
