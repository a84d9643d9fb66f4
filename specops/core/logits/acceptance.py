"""Opt-in lossy acceptance (docs/semantics.md, "Lossy acceptance"): the arguments' checks and the
tests each rule applies to one draft, shared by the chain's and the tree's (chain/lossy.py,
tree/lossy.py). Their tokens do NOT follow the target's distribution."""

from __future__ import annotations

import math

import torch

from ..sampling.probs import as_float
from ..sampling.randomness import uniforms_at
from ..sampling.slots import coin_slot

ACCEPTANCES = ("exact", "typical")
# vLLM's defaults for Medusa's typical acceptance.
POSTERIOR_THRESHOLD, POSTERIOR_ALPHA = 0.09, 0.3


def check_lossy(acceptance, posterior_threshold, posterior_alpha, acceptance_rate,
                verification="token") -> bool:
    """The lossy arguments of a public function; whether the call is lossy."""
    if acceptance not in ACCEPTANCES:
        raise ValueError(f'acceptance must be "exact" or "typical" (lossy: Medusa\'s typical '
                         f"acceptance); got {acceptance!r}")
    for name, value in (("posterior_threshold", posterior_threshold),
                        ("posterior_alpha", posterior_alpha)):
        if value is None:
            continue
        if acceptance != "typical":
            raise ValueError(f'{name} applies to acceptance="typical" only')
        if isinstance(value, bool) or not isinstance(value, (int, float)) or \
                not 0 <= as_float(value) < math.inf:
            raise ValueError(f"{name} must be a finite number >= 0; got {value!r}")
    if acceptance_rate is not None:
        if acceptance == "typical":
            raise ValueError('acceptance_rate replaces the acceptance rule: pass it without '
                             'acceptance="typical"')
        if isinstance(acceptance_rate, bool) or not isinstance(acceptance_rate, (int, float)) \
                or not 0 <= acceptance_rate <= 1:
            raise ValueError(f"acceptance_rate must be a number in [0, 1]; got "
                             f"{acceptance_rate!r}")
    lossy = acceptance == "typical" or acceptance_rate is not None
    if lossy and verification != "token":
        raise ValueError('verification="block" is a rule of exact acceptance; lossy acceptance '
                         "replaces it")
    return lossy


def typical_passes(logprobs: torch.Tensor, entropy: torch.Tensor, posterior_threshold=None,
                   posterior_alpha=None) -> torch.Tensor:
    """Medusa's test of drafts whose logprobs under their rows' processed distributions are
    ``logprobs``, the rows' entropies (nats) ``entropy``: p(d) > min(threshold,
    alpha * exp(-H)) (None: vLLM's defaults)."""
    threshold = POSTERIOR_THRESHOLD if posterior_threshold is None else float(posterior_threshold)
    alpha = POSTERIOR_ALPHA if posterior_alpha is None else float(posterior_alpha)
    bar = torch.clamp(alpha * torch.exp(-entropy.double()), max=threshold)
    return logprobs.double().exp() > bar


def rate_passes(seed: torch.Tensor, offset: torch.Tensor, batch: int, vocab: int, drafts: int,
                acceptance_rate: float) -> torch.Tensor:
    """(B, drafts) bool: draft j kept where the token rule's acceptance coin of position j
    (core/sampling/slots.py) lies below the rate."""
    # Built on the seed's device: no host-to-device copy (none may happen under graph capture).
    slots = coin_slot(vocab, 0) + 2 * torch.arange(drafts, dtype=torch.int64, device=seed.device)
    return uniforms_at(seed, offset, batch, slots) < acceptance_rate


def last_token_rows(kept, drafting, temperature, typical: bool):
    """(each request's drafts emitted (B,): the row its last token comes from; the temperature
    each request draws it at: 0 (the argmax) where typical acceptance rejected a draft, the
    request's own otherwise), from the drafts kept (B, N) and the drafts given (B, N)."""
    length = kept.int().cumprod(dim=-1).sum(dim=-1)
    temperature = temperature.expand(kept.shape[0])
    if typical:
        rejected = length < drafting.sum(dim=-1)
        temperature = torch.where(rejected, torch.zeros_like(temperature), temperature)
    return length, temperature


def lossy_outputs(draft_token_ids, kept, last, accepted_num, emitted_num) -> torch.Tensor:
    """A chain's output row under a lossy rule: the drafts (B, N) up to the first one not
    ``kept`` (B, N), then ``last`` (B,), then -1: (B, N + 1) int32; the counters added to in place
    (accepted: every draft kept, each judged on its own; emitted: the drafts emitted)."""
    length = kept.int().cumprod(dim=-1).sum(dim=-1)
    position = torch.arange(draft_token_ids.shape[1] + 1, device=draft_token_ids.device)
    padded = torch.nn.functional.pad(draft_token_ids.int(), (0, 1), value=-1)
    output = torch.where(position < length[:, None], padded,
                         torch.where(position == length[:, None], last.int()[:, None], -1))
    accepted_num.add_(kept.sum(dim=-1).to(accepted_num.dtype))
    emitted_num.add_(length.to(emitted_num.dtype))
    return output.int()
