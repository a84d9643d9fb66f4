"""Launching the chain kernels: grid, programs per request, scratch, and the launch options."""

from __future__ import annotations

import torch
import triton

from ..core.race import CHUNK_SIZE, num_chunks
from .kernel import chain_speculative_sampling_combine_kernel, chain_speculative_sampling_kernel

# Aim for about this many programs in flight (H100/H200: 132 SMs, ~4 programs each) when the batch
# alone cannot fill the GPU. A function of B and K only, so the launch is reproducible.
TARGET_PROGRAMS = 512
# Most programs one request is split over; the combine kernel reads them in one block.
MAX_SPLITS = 256
NUM_WARPS = 4  # 128 threads x 8 values of a 1024-value chunk: 16-byte loads even for bf16/fp16
# How the kernels are built (tests/test_triton_compile.py compiles with the same options). No
# multiply-add contraction, so every float operation rounds as the torch reference's does.
LAUNCH_OPTIONS = {"num_warps": NUM_WARPS, "num_stages": 1, "enable_fp_fusion": False}
COMBINE_LAUNCH_OPTIONS = {**LAUNCH_OPTIONS, "num_warps": 4}


def choose_num_splits(batch: int, vocab: int, requested: int | None = None) -> int:
    """Programs per request: enough to fill the GPU at small B (or ``requested``), each with an
    equal number of chunks and none without one."""
    chunks = num_chunks(vocab)
    if requested is None:
        requested = TARGET_PROGRAMS // max(batch, 1)
    splits = max(1, min(chunks, MAX_SPLITS, int(requested)))
    per_program = triton.cdiv(chunks, splits)
    return triton.cdiv(chunks, per_program)


def chain_speculative_sampling_triton(
    draft_probs: torch.Tensor | None,
    draft_token_ids: torch.Tensor,
    target_probs: torch.Tensor,
    accepted_num: torch.Tensor,
    emitted_num: torch.Tensor,
    seed: torch.Tensor,
    offset: torch.Tensor,
    num_splits: int | None = None,
) -> torch.Tensor:
    """Same contract as ``reference.chain_speculative_sampling_reference``: returns output_token_ids
    (B, N+1) int32 and adds to ``accepted_num`` / ``emitted_num`` in place.

    ``num_splits`` overrides the programs per request (tests use it to show the output does not
    depend on it); by default it is ``choose_num_splits(B, V)``.  No host synchronisation, and no
    allocation beyond the output and a (B, S) scratch when S > 1.
    """
    batch, num_draft = draft_token_ids.shape
    vocab = target_probs.shape[2]
    out = torch.empty((batch, num_draft + 1), dtype=torch.int32, device=target_probs.device)
    if batch == 0:
        return out
    # The row pass needs unit vocabulary stride (16-byte loads); other strides are passed through.
    if target_probs.stride(2) != 1:
        target_probs = target_probs.contiguous()
    if draft_probs is not None and draft_probs.stride(2) != 1:
        draft_probs = draft_probs.contiguous()

    chunks = num_chunks(vocab)
    splits = choose_num_splits(batch, vocab, num_splits)
    per_program = triton.cdiv(chunks, splits)
    split = splits > 1
    if split:
        split_key = torch.empty((batch, splits, 2), dtype=torch.float64, device=out.device)
        split_token = torch.empty((batch, splits, 2), dtype=torch.int32, device=out.device)
        split_e = torch.empty((batch,), dtype=torch.int32, device=out.device)
    else:  # never dereferenced (SPLIT is a compile-time False)
        split_key = split_token = split_e = out

    has_draft = draft_probs is not None
    draft = draft_probs if has_draft else target_probs  # placeholder pointer when None
    stride_db, stride_dn = (draft_probs.stride(0), draft_probs.stride(1)) if has_draft else (0, 0)
    chain_speculative_sampling_kernel[(batch, splits)](
        target_probs, draft, draft_token_ids, accepted_num, emitted_num, seed, offset, out,
        split_key, split_token, split_e,
        num_draft, vocab, chunks, per_program, splits,
        target_probs.stride(0), target_probs.stride(1), stride_db, stride_dn,
        draft_token_ids.stride(0), draft_token_ids.stride(1), accepted_num.stride(0),
        emitted_num.stride(0), out.stride(0),
        0 if seed.numel() == 1 else seed.stride(0),
        0 if offset.numel() == 1 else offset.stride(0),
        int(seed.numel() != 1),
        HAS_DRAFT=has_draft, SPLIT=split, BLOCK_N=triton.next_power_of_2(num_draft + 1),
        CHUNK=CHUNK_SIZE, **LAUNCH_OPTIONS,
    )
    if split:
        chain_speculative_sampling_combine_kernel[(batch,)](
            split_key, split_token, split_e, out, splits, out.stride(0),
            BLOCK_S=MAX_SPLITS, **COMBINE_LAUNCH_OPTIONS,
        )
    return out
