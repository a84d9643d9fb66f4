"""Verification from logits against what a user writes today, and against its floor.

    python benchmarks/from_logits.py             # CPU (and the GPU, when there is one)
    python benchmarks/from_logits.py --quick     # a smoke test

Per call, on the same inputs (each request's logits and its own sampling parameters):
* specops: ``specops.chain_speculative_sampling_from_logits``;
* user-written: what a caller builds today (vLLM V1's way): temperature, softmax, min-p, a sort
  for top-k and top-p (each only when some request asks for it), renormalising, one-hot rows for
  greedy requests, then
  ``specops.chain_speculative_sampling`` on the (B, N + 1, V) probabilities;
* floor: one read of the logits the call needs (every target row, and every draft row when the
  drafts come from ``draft_logits``: each row's normaliser enters a draft's judgement) at the
  device's copy bandwidth.
The user-written rows are checked against specops's rule first (``specops.core.logits``), so both
sides compute the same distributions.
"""

from __future__ import annotations

import argparse

import torch

import common  # benchmarks/common.py: a script's own folder is on sys.path

SHAPES = [(1, 4, 32000), (16, 4, 32000), (64, 4, 32000)]
QUICK_SHAPES = [(2, 2, 2000)]
# name -> (temperature, top_k, top_p, min_p) for every request; "mixed" gives each request its own
MIXES = {
    "T=1": (1.0, 0, 1.0, 0.0),
    "T=0.7 top-k 50": (0.7, 50, 1.0, 0.0),
    "T=0.7 top-p 0.9": (0.7, 0, 0.9, 0.0),
    "all four": (0.7, 50, 0.9, 0.05),
    "mixed, 1/4 greedy": None,
}


def parameters(mix: str, batch: int, device) -> dict:
    """The four (B,) parameter tensors of a mix."""
    if MIXES[mix] is None:  # every fourth request greedy, the others their own values
        b = torch.arange(batch, device=device)
        values = (torch.where(b % 4 == 0, 0.0, 0.5 + (b % 3) * 0.25), (b % 3) * 20,
                  torch.where(b % 2 == 0, 1.0, 0.9), torch.where(b % 5 == 1, 0.02, 0.0))
    else:
        values = [torch.full((batch,), v, device=device) for v in MIXES[mix]]
    temperature, top_k, top_p, min_p = values
    return dict(temperature=temperature.float(), top_k=top_k.long(), top_p=top_p.float(),
                min_p=min_p.float())


def user_processed(logits: torch.Tensor, temperature, top_k, top_p, min_p) -> torch.Tensor:
    """(B, R, V) float32 rows as a caller writes them today: temperature, softmax, min-p, top-k
    and top-p by one descending sort, renormalised; one-hot at the argmax for greedy requests."""
    greedy = (temperature == 0)[:, None, None]
    x = logits.float() / torch.where(greedy, 1.0, temperature[:, None, None])
    probs = x.softmax(-1)
    # As vLLM's sampler, each step only when some request asks for it (known on the host).
    if bool((min_p > 0).any()):
        probs = probs.masked_fill(probs < min_p[:, None, None] * probs.amax(-1, keepdim=True), 0)
    if bool((top_k > 0).any() | (top_p < 1).any()):
        probs = sorted_truncation(probs, top_k, top_p)
    one_hot = torch.nn.functional.one_hot(x.argmax(-1), logits.shape[-1]).float()
    return torch.where(greedy, one_hot, probs / probs.sum(-1, keepdim=True))


def sorted_truncation(probs: torch.Tensor, top_k, top_p) -> torch.Tensor:
    """top-k, then top-p of what is left (ties at either boundary kept), by one descending sort."""
    sorted_probs, order = probs.sort(-1, descending=True)
    vocab = probs.shape[-1]
    kth = torch.where(top_k > 0, top_k, vocab).clamp(max=vocab) - 1
    drop = sorted_probs < sorted_probs.gather(-1, kth[:, None, None].expand(-1, probs.shape[1], 1))
    sorted_probs = sorted_probs.masked_fill(drop, 0)
    mass = sorted_probs.cumsum(-1)
    before = mass - sorted_probs  # the mass of the more likely tokens
    # keep the smallest prefix whose mass reaches top_p, and every token tied with its last
    keep = before < top_p[:, None, None] * mass[..., -1:]
    last = torch.where(keep, sorted_probs, torch.inf).amin(-1, keepdim=True)
    sorted_probs = sorted_probs.masked_fill(sorted_probs < last, 0)
    return torch.zeros_like(probs).scatter_(-1, order, sorted_probs)


def inputs(batch, num_draft, vocab, device, gen, mix):
    """(draft logits, draft ids drawn from their processed rows, target logits, parameters)."""
    import specops.core.logits.rule as rule

    target = torch.randn(batch, num_draft + 1, vocab, generator=gen, device=gen.device) * 3
    draft = target[:, :num_draft] + torch.randn(batch, num_draft, vocab, generator=gen,
                                                device=gen.device)
    params = parameters(mix, batch, gen.device)
    flat = {k: v.repeat_interleave(num_draft) for k, v in params.items()}
    rows = rule.processed_rows(draft.reshape(-1, vocab), **flat).view(batch, num_draft, vocab)
    race = torch.empty_like(rows).exponential_(generator=gen)
    ids = (rows / race).argmax(-1)
    return (draft.to(device), ids.to(device), target.to(device),
            {k: v.to(device) for k, v in params.items()})


def check_user_rows(draft_logits, params) -> None:
    """The user-written rows are the rule's rows (up to rounding), so the two sides compare."""
    import specops.core.logits.rule as rule

    batch, rows, vocab = draft_logits.shape
    flat = {k: v.repeat_interleave(rows) for k, v in params.items()}
    ours = rule.processed_rows(draft_logits.reshape(-1, vocab), **flat).view(batch, rows, vocab)
    theirs = user_processed(draft_logits, **params)
    # A token at a top-p boundary may fall either side by rounding (float32 running sums against
    # exact masses): the rows must agree to within such a token's probability.
    if float((ours - theirs).abs().sum(-1).max()) > 1e-2:
        raise SystemExit("the user-written rows differ from specops's rule: the comparison would "
                         "not be of the same computation")


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="one small shape: a smoke test")
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    common.add_threads_option(parser)
    args = parser.parse_args(argv)
    device = common.require_device(args.device)
    common.use_threads(parser, args.threads, device)
    import specops

    gen = torch.Generator().manual_seed(0)
    bandwidth = common.copy_bandwidth(device, megabytes=16 if args.quick else 256)
    print(f"from logits on {common.describe_device(device)}, torch {torch.__version__}, copy "
          f"bandwidth {bandwidth / 1e9:.1f} GB/s (read + write); float32 logits; microseconds")
    print(f"{'B':>3s} {'N':>2s} {'V':>6s} {'drafts':>6s} {'parameters':>18s} {'specops':>9s} "
          f"{'user':>9s} {'user/specops':>12s} {'floor':>8s} {'specops/floor':>13s}")
    seed = torch.tensor([1], device=device)
    for batch, num_draft, vocab in QUICK_SHAPES if args.quick else SHAPES:
        for mix in MIXES:
            draws = [inputs(batch, num_draft, vocab, device, gen, mix) for _ in range(3)]
            check_user_rows(draws[0][0], draws[0][3])
            for drafts in ("probs", "logits"):
                # Drafts from draft probabilities: the caller has processed the draft rows
                # already (it sampled from them); only the target's logits are the op's work.
                prepared = [(user_processed(d, **p) if drafts == "probs" else None)
                            for d, _, _, p in draws]

                def ours(i):
                    draft_logits, ids, target, params = draws[i]
                    return specops.chain_speculative_sampling_from_logits(
                        prepared[i], ids, target,
                        draft_logits=draft_logits if drafts == "logits" else None,
                        seed=seed, **params)

                def user(i):
                    draft_logits, ids, target, params = draws[i]
                    draft = prepared[i] if drafts == "probs" else user_processed(draft_logits,
                                                                                 **params)
                    return specops.chain_speculative_sampling(
                        draft, ids, user_processed(target, **params), seed=seed)

                t_ours = common.time_eager(ours, len(draws), device)
                t_user = common.time_eager(user, len(draws), device)
                rows = batch * (num_draft + 1 + (num_draft if drafts == "logits" else 0))
                floor = rows * vocab * 4 / (bandwidth / 2)  # read only
                print(f"{batch:3d} {num_draft:2d} {vocab:6d} {drafts:>6s} {mix:>18s} "
                      f"{t_ours * 1e6:9.0f} {t_user * 1e6:9.0f} {t_user / t_ours:12.2f} "
                      f"{floor * 1e6:8.1f} {t_ours / floor:13.1f}", flush=True)


if __name__ == "__main__":
    main()
