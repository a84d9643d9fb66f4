"""The Triton launcher of the logprobs op: every row's statistics (``core/logits/launch.py``, the
kernel the verifiers read logits through), then each wanted token's logprob from its logit and
its row's statistics (``tokens.py``): no processed row is written.

A sampled row's statistics hold m, c, the keep limit L and r = 1 / W (core/logits/triton.py): a
token x is kept where the bits of m - x, read unsigned, are below L; log(W) is -log(r), the
reference's up to r's float32 rounding."""

from __future__ import annotations

import torch

from ..launch.launcher import TritonKernel, build_options
from ..logits.launch import row_statistics
from ..sampling.race import CHUNK_SIZE
from .kernel import row_entropy_kernel
from ..logits.rule import ORDERS
from .tokens import RowFacts, token_logprobs

ENTROPY = TritonKernel(row_entropy_kernel, **build_options(4))  # a row pass, as the samplers'


def token_logprobs_triton(logits, token_ids, temperature, top_k, top_p, min_p, num_top=0,
                          processing_order="vllm"):
    """``rule.token_logprobs_reference``'s outputs, from the rows' statistics."""
    logits = logits if logits.stride(-1) == 1 else logits.contiguous()  # unit stride
    batch, positions, vocab = logits.shape
    stats = row_statistics(logits, temperature, top_k, top_p, min_p,
                           min_p_last=ORDERS[processing_order])
    mode, peak, coef, limit, scale, index = (column[:, None] for column in stats.unbind(-1))
    facts = RowFacts(mode.int(), peak.float(), coef.float(), -scale.float().double().log(),
                     index.long())

    def kept(ids, x):
        return ((peak.float() - x).view(torch.int32).long() & 0xFFFFFFFF) < limit

    rows = logits.reshape(batch * positions, vocab)
    ranked = None
    if num_top:  # the top tokens: one topk pass over the rows, NaN and infinities as -inf
        x = rows.float()
        ranked = torch.where(torch.isfinite(x), x, -torch.inf)
    result = token_logprobs(rows, facts, token_ids, num_top, kept, ranked)
    return tuple(value.view(batch, positions, *value.shape[1:]) for value in result)


def row_entropy_triton(logits, temperature, top_k, top_p, min_p, processing_order="vllm"):
    """``rule.row_entropy_reference``'s (B, P) entropies: the rows' statistics, then one pass
    over each row through them."""
    logits = logits if logits.stride(-1) == 1 else logits.contiguous()  # unit stride
    batch, positions, vocab = logits.shape
    out = torch.empty((batch, positions), dtype=torch.float32, device=logits.device)
    if out.numel() == 0:
        return out
    stats = row_statistics(logits, temperature, top_k, top_p, min_p,
                           min_p_last=ORDERS[processing_order])
    stride_b, stride_n, _ = logits.stride()
    ENTROPY.fn[(batch * positions,)](logits, stats, out, positions, vocab, stride_b, stride_n,
                                     CHUNK=CHUNK_SIZE, **ENTROPY.options)
    return out
