"""CPU speed of the pure-torch reference against a per-request loop and a one-read floor.

    python benchmarks/reference_cpu.py            # B=64, N=4, V=32000, float32, one thread

Three timings, measured side by side in one run (these machines are noisy, so ratios matter):
  * reference: torch.ops.specops.chain_speculative_sampling on CPU (the vectorised reference);
  * loop:      what a user would write: a Python loop over requests and positions that samples
               with torch.multinomial;
  * floor:     torch.sum over a (B, 2, V) tensor, one read of the rows the op needs.
Inputs rotate over several sets larger than the caches, so no timing reads a cached copy.
Goals (issue 2): loop / reference >= 15 and reference / floor <= 8.
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch

import specops  # noqa: F401  (registers the op)


def make_inputs(batch, num_draft, vocab, generator):
    target = torch.rand(batch, num_draft + 1, vocab, generator=generator) ** 4
    target /= target.sum(-1, keepdim=True)
    draft = torch.rand(batch, num_draft, vocab, generator=generator) ** 4
    draft /= draft.sum(-1, keepdim=True)
    ids = torch.multinomial(draft.view(-1, vocab), 1, generator=generator).view(batch, num_draft)
    return draft, ids, target


def per_request_loop(draft, ids, target, generator):
    """The straightforward implementation: one request and one position at a time."""
    batch, num_draft = ids.shape
    out = torch.full((batch, num_draft + 1), -1, dtype=torch.int64)
    for b in range(batch):
        for j in range(num_draft + 1):
            p = target[b, j]
            if j == num_draft:
                out[b, j] = torch.multinomial(p, 1, generator=generator)
                break
            d = int(ids[b, j])
            q = draft[b, j]
            if torch.rand((), generator=generator) * q[d] < p[d]:
                out[b, j] = d
                continue
            residual = (p - q).clamp_min(0)
            out[b, j] = torch.multinomial(residual / residual.sum(), 1, generator=generator)
            break
    return out


def time_it(fn, inputs, repeats):
    """Median seconds of fn over `repeats` runs, cycling through the input sets."""
    times = []
    for i in range(repeats):
        args = inputs[i % len(inputs)]
        start = time.perf_counter()
        fn(*args)
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--batch-size", type=int, default=64)
    parser.add_argument("--draft-len", type=int, default=4)
    parser.add_argument("--vocab", type=int, default=32000)
    parser.add_argument("--sets", type=int, default=4, help="input sets rotated between timings")
    parser.add_argument("--repeats", type=int, default=20)
    parser.add_argument("--threads", type=int, default=1)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)

    g = torch.Generator().manual_seed(0)
    B, N, V = args.batch_size, args.draft_len, args.vocab
    sets = [make_inputs(B, N, V, g) for _ in range(args.sets)]
    rows = [(torch.rand(B, 2, V, generator=g),) for _ in range(args.sets)]

    def reference(draft, ids, target):
        acc = torch.zeros(B, dtype=torch.int32)
        emitted = torch.zeros(B, dtype=torch.int32)
        seed, offset = torch.tensor([1]), torch.tensor([0])
        return torch.ops.specops.chain_speculative_sampling(draft, ids, target, acc, emitted, seed, offset)

    def loop(draft, ids, target):
        return per_request_loop(draft, ids, target, g)

    def floor(x):
        return torch.sum(x)

    for fn, inputs in ((reference, sets), (loop, sets), (floor, rows)):  # warm-up
        time_it(fn, inputs, 2)
    t_ref = time_it(reference, sets, args.repeats)
    t_loop = time_it(loop, sets, max(3, args.repeats // 4))
    t_floor = time_it(floor, rows, args.repeats)

    print(f"B={B} N={N} V={V} float32, {args.threads} thread(s), torch {torch.__version__}")
    print(f"{'implementation':<34}{'median ms':>12}")
    print(f"{'reference (specops, CPU)':<34}{t_ref * 1e3:>12.3f}")
    print(f"{'per-request loop + multinomial':<34}{t_loop * 1e3:>12.3f}")
    print(f"{'floor: torch.sum over (B, 2, V)':<34}{t_floor * 1e3:>12.3f}")
    print(f"loop / reference  = {t_loop / t_ref:6.1f}x   (goal >= 15)")
    print(f"reference / floor = {t_ref / t_floor:6.1f}x   (goal <= 8)")


if __name__ == "__main__":
    main()
