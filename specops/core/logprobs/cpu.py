"""The CPU backend of the logprobs op: the rule's kept tokens (``core/logits/cpu.py``'s
``kept_weights``, each step on the rows that need it), then each wanted token's logprob from its
logit and its row's quantities (``tokens.py``), not the reference's whole float64 rows."""

from __future__ import annotations

import torch

from ..logits import cpu, rule
from ..ops.backends import in_inference_mode
from .rule import LN2, requests_rows
from .tokens import GREEDY, NO_MASS, SAMPLED, RowFacts, token_logprobs


def _kept(logits, temperature, top_k, top_p, min_p, processing_order):
    """The rule's quantities of requests' rows (B, P, V): (each row's parameters, the rows
    (R, V), their float32 logits x with invalid ones -inf, peaks (R, 1), weights e, kept tokens)."""
    batch, positions, vocab = logits.shape
    params = [rule.per_row(value, batch, positions) for value in (temperature, top_k, top_p,
                                                                  min_p)]
    rows = logits.reshape(batch * positions, vocab)
    valid, e, keep = cpu.kept_weights(rows, *params, rule.ORDERS[processing_order])
    x = torch.where(valid, rows.float(), -torch.inf)
    return params, rows, x, x.amax(dim=-1, keepdim=True), e, keep


@in_inference_mode
def token_logprobs_cpu(logits, token_ids, temperature, top_k, top_p, min_p, num_top=0,
                       processing_order="vllm", entropy=False, *step_inputs):
    """``rule.token_logprobs_reference``'s outputs."""
    logits = requests_rows(logits, token_ids, *step_inputs)
    batch, positions, vocab = logits.shape
    params, rows, x, peak, e, keep = _kept(logits, temperature, top_k, top_p, min_p,
                                           processing_order)
    index = x.argmax(dim=-1, keepdim=True)  # the first index of the largest
    t = params[0][:, None]
    mode = torch.where(t == 0, GREEDY, SAMPLED)
    mode = torch.where(rule.out_of_range(*params)[:, None] | (peak == -torch.inf), NO_MASS, mode)
    mass = rule.kept_mass(e, keep)
    facts = RowFacts(mode, peak, rule.coefficient(t), mass.log()[:, None], index)
    ranked = torch.where(keep, x, -torch.inf) if num_top else None
    result = token_logprobs(lambda ids: rows.gather(1, ids).float(), vocab, facts, token_ids,
                            num_top, lambda ids, _: keep.gather(1, ids), ranked)
    entropies = (row_entropy(x, peak, e, keep, mass, mode[:, 0], t[:, 0]) if entropy
                 else x.new_empty((batch, 0)))
    return (result[0].view(token_ids.shape),
            *(value.view(batch, positions, *value.shape[1:]) for value in result[1:]),
            entropies.view(batch, positions if entropy else 0))


def row_entropy(x, peak, e, keep, mass, mode, temperature):
    """float32 (R,): H = ln W - ln 2 * sum (e / W) t over the kept tokens, t = (x - m) c the
    base-2 log of the weight e (a weight that underflows adds nothing); 0 unless sampled."""
    t = (x - peak) * rule.coefficient(temperature)[:, None]
    weighted = torch.where(keep & (e > 0), e.double() * t.double(), 0.0).sum(dim=-1)
    entropy = mass.log() - LN2 * weighted / mass
    return torch.where(mode == SAMPLED, entropy, 0.0).float()
