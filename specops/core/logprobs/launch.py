"""The Triton launcher of the logprobs op: every row's statistics (``core/logits/launch.py``, the
kernel the verifiers read logits through), then each wanted token's logprob from its logit and
its row's statistics (``tokens.py``), and each row's entropy where asked for, in one more pass
of the statistics kernel: no processed row is written.

A sampled row's statistics hold m, c, the keep limit L and r = 1 / W (core/logits/triton.py): a
token x is kept where the bits of m - x, read unsigned, are below L; log(W) is -log(r), the
reference's up to r's float32 rounding."""

from __future__ import annotations

import torch

from ..logits.launch import row_statistics, step_arguments
from ..logits.rule import BITS, ORDERS, Step, adjusted_at
from ..sampling.flattened import Padded
from .rule import requests_rows
from .tokens import RowFacts, token_logprobs


def token_logprobs_triton(logits, token_ids, temperature, top_k, top_p, min_p, num_top=0,
                          processing_order="vllm", entropy=False, generated_ids=None,
                          cu_num_draft_tokens=None, *step_inputs):
    """``rule.token_logprobs_reference``'s outputs, from the rows' statistics, rule step 0
    applied as the statistics kernel reads the rows and, by torch, at the wanted tokens alone
    (``rule.adjusted_at``): no adjusted row is written but for ranking the top tokens."""
    logits = logits if logits.stride(-1) == 1 else logits.contiguous()  # unit stride
    batch, positions = token_ids.shape[:2]
    vocab = logits.shape[-1]
    device = logits.device
    step = Step(*step_inputs)
    cu = cu_num_draft_tokens
    if cu is None:  # padded: request b's rows (B, P, V), row p counting its list's first p ids
        layout, slots = None, None
        lists = generated_ids
        if lists is None:
            lists = torch.full((1, 1, 1), -1, dtype=torch.int64, device=device)
        lists = lists.expand(batch, positions, -1)
    else:  # flattened: the padded batch's slot (b, p) reads row min(p, n_b) of request b
        layout = (cu, positions, 1)
        padded = Padded(cu, logits.shape[0] - batch, positions - 1)
        lists = padded.ids(generated_ids)[:, None, :].expand(batch, positions, -1)
        slots = padded.target_rows - padded.target_rows[:, :1]  # min(p, n_b)
    target_step = None
    if step.changes_logits():
        if cu is None:  # at least P - 1 ids a row: the kernel reads row p's up to p
            ids = torch.nn.functional.pad(lists, (0, max(positions - 1 - lists.shape[-1], 0)),
                                          value=-1)
            target_step = step_arguments(step, ids, device)
        else:
            target_step = step_arguments(step, generated_ids, device, max(positions - 1, 0))
    entropies = torch.empty((batch * positions if entropy else 0,), dtype=torch.float32,
                            device=device)
    stats = row_statistics(logits, temperature, top_k, top_p, min_p, layout,
                           min_p_last=ORDERS[processing_order], step=target_step,
                           entropy=entropies if entropy and entropies.numel() else None)
    if slots is not None:  # each slot's row's statistics (and entropy)
        slot_rows = (torch.arange(batch, device=device)[:, None] * positions + slots).view(-1)
        stats = stats[slot_rows]
        entropies = entropies[slot_rows] if entropy else entropies
    mode, peak, coef, limit, scale, index = (column[:, None] for column in stats.unbind(-1))
    facts = RowFacts(mode.int(), peak.float(), coef.float(), -scale.float().double().log(),
                     index.long())

    def kept(ids, x):
        return ((peak.float() - x).view(torch.int32).long() & 0xFFFFFFFF) < limit

    def logits_at(ids):  # (B * P, K) ids in [0, V): the rows' logits there, step 0 applied
        ids = ids.view(batch, positions, ids.shape[-1])
        if cu is None:
            x = logits.gather(2, ids).float()
            words = (None if step.allowed_token_bitmask is None else
                     step.allowed_token_bitmask.gather(2, ids // BITS))
        else:
            rows = padded.target_rows[..., None]
            x = logits[rows, ids].float()
            words = (None if step.allowed_token_bitmask is None else
                     step.allowed_token_bitmask[rows, ids // BITS])
        if step.changes_logits():
            x = adjusted_at(x, ids, vocab, step, words, lists)
        return x.view(batch * positions, ids.shape[-1])

    ranked = None
    if num_top:  # the top tokens: one topk pass over (adjusted) rows, NaN and infinities as -inf
        x = requests_rows(logits, token_ids, generated_ids, cu, *step_inputs).float()
        x = x.reshape(batch * positions, vocab)
        ranked = torch.where(torch.isfinite(x), x, -torch.inf)
    result = token_logprobs(logits_at, vocab, facts, token_ids, num_top, kept, ranked)
    return (result[0].view(token_ids.shape),
            *(value.view(batch, positions, *value.shape[1:]) for value in result[1:]),
            entropies.view(batch, positions if entropy else 0))
