"""The cost of each part of the sampling step inside verification from logits: the call with
none of them against the same call with the draft's own parameters, a logit bias, a grammar mask,
the penalties, all of them, the logprobs of the output tokens (raw, processed, with the top 5),
and the lossy acceptance rules (token verification's place), side by side in one run.

    python benchmarks/sampling_step.py                     # CPU: B = 8, N = 4, V = 32000
    python benchmarks/sampling_step.py --device cuda --batch 64 --vocab 128256

Printed per verification: median microseconds per call of each variant and its ratio to the plain
call. The requests sample with temperature and min-p, no top-k or top-p, so that the ratios show
what each part adds rather than the truncations' searches. On a GPU the kernels apply the bias,
the mask and the penalties as they read the logits, and so do the logprobs and lossy acceptance
(docs/internals/kernel.md), so their ratios there are the price of reading step 0's inputs.
"""

from __future__ import annotations

import argparse
import os
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from common import (DTYPES, add_threads_option, describe_device, require_device,  # noqa: E402
                    time_eager, use_threads)

import specops  # noqa: E402
from specops.core.logits.rule import packed_bitmask  # noqa: E402


def inputs(batch, num_draft, vocab, dtype, device, gen):
    """Target and draft logits, drafts drawn from the draft's softmax, and step 0's tensors: a
    bias, a mask allowing about half the tokens, output counts and a prompt mask."""
    target = torch.randn(batch, num_draft + 1, vocab, generator=gen) * 3
    draft = target[:, :num_draft] + torch.randn(batch, num_draft, vocab, generator=gen)
    ids = torch.multinomial(draft.softmax(-1).reshape(-1, vocab), 1, generator=gen)
    mask = packed_bitmask(torch.rand(batch, num_draft + 1, vocab, generator=gen) < 0.5)
    counts = torch.randint(0, 3, (batch, vocab), generator=gen) * (
        torch.rand(batch, vocab, generator=gen) < 0.01)
    step = dict(
        logit_bias=(torch.randn(batch, vocab, generator=gen) * 0.1).to(device),
        allowed_token_bitmask=mask.to(device),
        penalties=dict(repetition_penalty=1.2, frequency_penalty=0.3, presence_penalty=0.2,
                       output_token_counts=counts.to(device),
                       prompt_token_mask=(torch.rand(batch, vocab, generator=gen) < 0.01)
                       .to(device)))
    return (target.to(device, dtype), draft.to(device, dtype),
            ids.reshape(batch, num_draft).to(device), step)


def variants(step: dict) -> dict:
    """Each variant's extra arguments."""
    draft_own = dict(draft_temperature=0.7, draft_min_p=0.05)
    everything = dict(draft_own, logit_bias=step["logit_bias"],
                      allowed_token_bitmask=step["allowed_token_bitmask"], **step["penalties"])
    return {"plain": {}, "draft's own parameters": draft_own,
            "logit bias": dict(logit_bias=step["logit_bias"]),
            "grammar mask": dict(allowed_token_bitmask=step["allowed_token_bitmask"]),
            "penalties": step["penalties"], "all of them": everything,
            "raw logprobs": dict(logprobs="raw"),
            "processed logprobs": dict(logprobs="processed"),
            "processed logprobs, top 5": dict(logprobs="processed", num_top_logprobs=5),
            "all, processed logprobs": dict(everything, logprobs="processed"),
            "typical acceptance": dict(acceptance="typical"),
            "acceptance rate 0.7": dict(acceptance_rate=0.7),
            "all, typical acceptance": dict(everything, acceptance="typical")}

# Token rule only: block verification refuses them.
LOSSY = ("typical acceptance", "acceptance rate 0.7", "all, typical acceptance")


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--batch", type=int, default=8)
    parser.add_argument("--num-draft", type=int, default=4)
    parser.add_argument("--vocab", type=int, default=32000)
    parser.add_argument("--dtype", choices=sorted(DTYPES), default="float32")
    parser.add_argument("--verification", choices=("token", "block"), nargs="+",
                        default=["token", "block"])
    add_threads_option(parser)
    args = parser.parse_args(argv)
    device = require_device(args.device)
    use_threads(parser, args.threads, device)
    gen = torch.Generator().manual_seed(0)
    target, draft, ids, step = inputs(args.batch, args.num_draft, args.vocab,
                                      DTYPES[args.dtype], device, gen)
    seed = torch.arange(args.batch, device=device)
    print(f"# {describe_device(device)}, torch {torch.__version__}; B = {args.batch}, "
          f"N = {args.num_draft}, V = {args.vocab}, {args.dtype}; temperature 0.9, min-p 0.02, "
          f"drafts from draft logits")
    print(f"{'verify':<6} {'variant':<24} {'us':>10} {'ratio':>7}")
    for verification in args.verification:
        plain = None
        for name, extra in variants(step).items():
            if verification == "block" and name in LOSSY:
                continue
            def call(i, extra=extra):
                return specops.chain_speculative_sampling_from_logits(
                    None, ids, target, draft_logits=draft, temperature=0.9, min_p=0.02,
                    seed=seed, verification=verification, **extra)
            seconds = time_eager(call, 1, device)
            plain = plain or seconds
            print(f"{verification:<6} {name:<24} {seconds * 1e6:>10.1f} {seconds / plain:>7.2f}")


if __name__ == "__main__":
    main()
