"""Launching ``triton.row_statistics_kernel`` (one program per row of logits) and
``triton.processed_rows_kernel``, each one ``kernel[grid]`` launch (core/launch/launcher.py)."""

from __future__ import annotations

import torch
import triton

from ..launch.launcher import TritonKernel, build_options, placeholder
from ..sampling.race import CHUNK_SIZE
from .triton import processed_rows_kernel, row_statistics_kernel

STATS_FIELDS = 6  # triton.STATS
# How the samplers build the kernels that read logits (no multiply-add contraction, as every
# kernel): a row loop then does about twice the work per value of one reading probabilities
# (triton.processed), so 2 warps, 16 values a thread per chunk, share each chunk's block
# reduction among twice the values (docs/internals/kernel.md, the instruction budget).
FROM_LOGITS_OPTIONS = build_options(2)
# The statistics kernel likewise; given no register cap at 2 warps, ptxas keeps it to 64 registers
# and spills around the bisections' bookkeeping, and with a cap of 128 it takes what it needs.
STATISTICS = TritonKernel(row_statistics_kernel, **build_options(2, maxnreg=128))
# A row pass over 1024-value chunks, as the samplers' (4 warps: 8 values a thread).
PROCESSED = TritonKernel(processed_rows_kernel, **build_options(4))


def row_statistics(logits: torch.Tensor, temperature: torch.Tensor, top_k: torch.Tensor,
                   top_p: torch.Tensor, min_p: torch.Tensor,
                   flattened: tuple[torch.Tensor, int, int] | None = None,
                   min_p_last: bool = False) -> torch.Tensor:
    """float64 (B * positions, STATS_FIELDS) statistics of every row of logits (B, positions, V)
    (vocabulary stride 1), under each request's parameters (1 or B values each).

    ``flattened`` = (cu, positions, bonus): the logits are a flattened batch's (rows, V), request
    b's n_b + bonus rows from row cu[b] + b * bonus (core/launch/rows_triton.py); the statistics
    are laid out ``positions`` a request, as a padded batch's, and written for its rows only.
    ``min_p_last``: min-p after top-k and top-p (``rule.processed_rows``)."""
    if flattened is None:
        batch, positions, vocab = logits.shape
        stride_b, stride_n, _ = logits.stride()
        cu, num_tokens, bonus = placeholder(logits.device, torch.int64), 0, 0
    else:
        cu, positions, bonus = flattened
        batch, vocab = cu.shape[0] - 1, logits.shape[1]
        num_tokens = logits.shape[0] - batch * bonus  # T: the drafts' rows
        stride_b, stride_n = 0, logits.stride(0)
    stats = torch.empty((batch * positions, STATS_FIELDS), dtype=torch.float64,
                        device=logits.device)
    if stats.numel() == 0:
        return stats
    strides = [int(p.numel() != 1) * p.stride(0) for p in (temperature, top_k, top_p, min_p)]
    STATISTICS.fn[(batch * positions,)](logits, stats, temperature, top_k, top_p, min_p, cu,
                                        positions, num_tokens, bonus, vocab, stride_b, stride_n,
                                        *strides, int(min_p_last), CHUNK=CHUNK_SIZE,
                                        VARLEN=flattened is not None,
                                        **STATISTICS.options)
    return stats


def processed_rows(logits: torch.Tensor, temperature: torch.Tensor, top_k: torch.Tensor,
                   top_p: torch.Tensor, min_p: torch.Tensor, min_p_last: bool = False
                   ) -> torch.Tensor:
    """``rule.processed_rows`` of every row of logits (B, positions, V) under each request's
    parameters (1 or B values each): float32 (B, positions, V), written by the GPU (the
    statistics, then one pass that writes the rows)."""
    logits = logits if logits.stride(2) == 1 else logits.contiguous()  # 16-byte row loads
    batch, positions, vocab = logits.shape
    out = torch.empty((batch, positions, vocab), dtype=torch.float32, device=logits.device)
    if out.numel() == 0:
        return out
    stats = row_statistics(logits, temperature, top_k, top_p, min_p, min_p_last=min_p_last)
    stride_b, stride_n, _ = logits.stride()
    PROCESSED.fn[(batch * positions, triton.cdiv(vocab, CHUNK_SIZE))](
        logits, stats, out, positions, vocab, stride_b, stride_n, CHUNK=CHUNK_SIZE,
        **PROCESSED.options)
    return out
