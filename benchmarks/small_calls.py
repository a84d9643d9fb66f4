"""Small calls on CPU: every way to verify one request (B = 1) beside token verification from
probabilities, the cheapest call, at the same size; and verification from logits beside softmax
plus the probability op.

    python benchmarks/small_calls.py                 # B = 1, N = 4, V = 16 and 32000
    python benchmarks/small_calls.py --vocab 16 --num-draft 1 2 4
    python benchmarks/small_calls.py --softmax       # from logits (T = 1) against softmax + op

Every call of a point is timed in every round, in a new order each round (the machine drifts
between minutes); a round calls each one ``--calls`` times in a row. Time is this thread's CPU
time (``time.thread_time``; one torch thread does all the work), so that other jobs on a shared
machine, which take the core away, do not count; ``--wall`` times wall-clock instead. Printed:
each call's median round in microseconds per call, its ratio to token verification from probabilities, and the torch
operations it runs (top-level aten operations under torch.profiler: the fixed cost per call). The
public functions are called as applications call them (eager, one torch thread).
"""

from __future__ import annotations

import argparse
import platform
import random
import statistics
import time

import torch

import specops
from specops.core.logits.rule import packed_bitmask

GOAL = 2.0  # every small call within this factor of token verification from probabilities


def calls(batch: int, num_draft: int, vocab: int, gen: torch.Generator) -> dict:
    """name -> a no-argument call, on one set of inputs: logits on a scale where top-k 5, top-p
    0.9 and min-p 0.05 each drop tokens."""
    target_logits = torch.randn(batch, num_draft + 1, vocab, generator=gen) * 3
    draft_logits = torch.randn(batch, num_draft, vocab, generator=gen) * 3
    draft_probs, target_probs = draft_logits.softmax(-1), target_logits.softmax(-1)
    ids = torch.multinomial(draft_probs.view(-1, vocab), 1, generator=gen).view(batch, num_draft)
    probs = specops.chain_speculative_sampling
    logits = specops.chain_speculative_sampling_from_logits

    def from_logits(verification="token", drafts="probs", **params):
        source = dict(draft_logits=draft_logits) if drafts == "logits" else {}
        first = None if drafts in ("logits", "greedy") else draft_probs
        return lambda: logits(first, ids, target_logits, seed=1, verification=verification,
                              **source, **params)

    every = dict(temperature=0.7, top_k=5, top_p=0.9, min_p=0.05)
    # A grammar mask allowing about half of the tokens, and every draft token.
    allowed = torch.rand(batch, num_draft + 1, vocab, generator=gen) < 0.5
    allowed.scatter_(2, ids[:, :, None], True)
    mask = packed_bitmask(allowed)
    return {
        "token, probs": lambda: probs(draft_probs, ids, target_probs, seed=1),
        "token, probs, greedy drafts": lambda: probs(None, ids, target_probs, seed=1),
        "token, logits T=1": from_logits(),
        "token, logits T=0.7": from_logits(temperature=0.7),
        "token, logits T=0": from_logits(temperature=0.0),
        "token, logits top-k 5": from_logits(top_k=5),
        "token, logits top-p 0.9": from_logits(top_p=0.9),
        "token, logits min-p 0.05": from_logits(min_p=0.05),
        "token, logits all four": from_logits(**every),
        "token, logits draft_logits": from_logits(drafts="logits"),
        "token, logits draft_logits top-p": from_logits(drafts="logits", top_p=0.9),
        "token, logits grammar mask": from_logits(allowed_token_bitmask=mask),
        "block, probs": lambda: probs(draft_probs, ids, target_probs, seed=1,
                                      verification="block"),
        "block, logits T=1": from_logits("block"),
        "block, logits top-p 0.9": from_logits("block", top_p=0.9),
        "block, logits draft_logits all four": from_logits("block", "logits", **every),
    }


def softmax_calls(batch: int, num_draft: int, vocab: int, gen: torch.Generator) -> dict:
    """From logits at T = 1 against what a caller writes without it: softmax, then the op."""
    target_logits = torch.randn(batch, num_draft + 1, vocab, generator=gen) * 3
    draft_probs = (torch.randn(batch, num_draft, vocab, generator=gen) * 3).softmax(-1)
    ids = torch.multinomial(draft_probs.view(-1, vocab), 1, generator=gen).view(batch, num_draft)
    return {
        "softmax + token, probs": lambda: specops.chain_speculative_sampling(
            draft_probs, ids, target_logits.softmax(-1), seed=1),
        "token, logits T=1": lambda: specops.chain_speculative_sampling_from_logits(
            draft_probs, ids, target_logits, seed=1),
    }


def operations(call) -> int:
    """Top-level aten operations one call runs (those not inside another aten operation)."""
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CPU]) as prof:
        call()
    return sum(1 for event in prof.events() if event.name.startswith("aten::")
               and (event.cpu_parent is None or not event.cpu_parent.name.startswith("aten::")))


def measure(named: dict, rounds: int, per_round: int, baseline: str, clock) -> None:
    for call in named.values():  # warm-up: first-call costs, caches
        call(), call()
    times = {name: [] for name in named}
    order = list(named)
    for _ in range(rounds):
        random.shuffle(order)
        for name in order:
            call = named[name]
            start = clock()
            for _ in range(per_round):
                call()
            times[name].append((clock() - start) / per_round * 1e6)
    base = statistics.median(times[baseline])
    print(f"| call | us | / {baseline} | torch ops |")
    print("| --- | ---: | ---: | ---: |")
    for name in named:
        median = statistics.median(times[name])
        print(f"| {name} | {median:.0f} | {median / base:.2f} | {operations(named[name])} |")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--vocab", type=int, nargs="+", default=[16, 32000])
    parser.add_argument("--num-draft", type=int, nargs="+", default=[4])
    parser.add_argument("--batch", type=int, nargs="+", default=[1])
    parser.add_argument("--rounds", type=int, default=15)
    parser.add_argument("--calls", type=int, default=5, help="calls per round")
    parser.add_argument("--wall", action="store_true", help="wall-clock time, not CPU time")
    parser.add_argument("--softmax", action="store_true",
                        help="from logits (T = 1) against softmax + the probability op")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    torch.set_num_threads(1)
    random.seed(args.seed)
    clock = time.perf_counter if args.wall else time.thread_time
    print(f"{platform.processor() or platform.machine()}, torch {torch.__version__}, "
          f"Python {platform.python_version()}, one torch thread, float32, "
          f"{time.strftime('%Y-%m-%d')}")
    for batch in args.batch:
        for num_draft in args.num_draft:
            for vocab in args.vocab:
                gen = torch.Generator().manual_seed(args.seed)
                print(f"\nB = {batch}, N = {num_draft}, V = {vocab}, {args.rounds} rounds of "
                      f"{args.calls} calls, {'wall-clock' if args.wall else 'CPU'} time\n")
                if args.softmax:
                    measure(softmax_calls(batch, num_draft, vocab, gen), args.rounds,
                            args.calls, "softmax + token, probs", clock)
                else:
                    measure(calls(batch, num_draft, vocab, gen), args.rounds, args.calls,
                            "token, probs", clock)


if __name__ == "__main__":
    main()
