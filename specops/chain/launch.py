"""Launching the chain kernel: programs per request (occupancy.py), the output with its scratch in
one allocation, and a launch that skips Triton's argument binder once a specialisation is loaded."""

from __future__ import annotations

import functools

import torch
import triton

from ..core import triton_launch
from ..core.race import CHUNK_SIZE, num_chunks
from . import slots
from .kernel import chain_speculative_sampling_kernel, combine_kernel
from .occupancy import MAX_PROGRAMS_PER_REQUEST, NUM_WARPS, launch_plan

# Chunks whose masses a program holds at once (one float32 per thread and race at 4 warps).
GROUP = 128
# How the kernels are built (tests/test_triton_compile.py compiles with the same options). No
# multiply-add contraction, so every float operation rounds as the torch reference's does.
LAUNCH_OPTIONS = {"num_warps": NUM_WARPS, "num_stages": 1, "enable_fp_fusion": False}


def block_n(num_draft: int) -> int:
    """Lanes of the acceptance vector: N drafts and the bonus position, at least 4 (with 2, ptxas
    allocates more registers, which would cost a resident program per SM)."""
    return max(4, 1 << num_draft.bit_length())  # next power of 2 above N (triton's is slow)


@functools.lru_cache(maxsize=64)
def _per_num_draft(num_draft: int) -> tuple[int, int, int]:
    """(lanes of the acceptance vector, Philox slot of the inverse-CDF uniform, of chunk 0)."""
    return block_n(num_draft), slots.cdf_slot(num_draft), slots.race_slot(num_draft, 0)


def scratch_int32s(batch: int, num_draft: int, programs: int) -> int:
    """int32 words the output allocation holds past the (B, N+1) output when P > 1
    (kernel._scratch): 8-byte alignment padding, float64 (B, P, 2) keys, int32 (B, P) tokens,
    int32 (B,) e."""
    if programs == 1:
        return 0
    return (batch * (num_draft + 1)) % 2 + batch * programs * 5 + batch


def _empty_output(batch, num_draft, programs, device):
    """The (B, N+1) int32 output, contiguous, in an allocation that also holds the scratch: one
    allocation per call, private to the call (safe on concurrent streams and in CUDA graphs)."""
    size = batch * (num_draft + 1) + scratch_int32s(batch, num_draft, programs)
    # Shrinking in place keeps the allocation and makes no new tensor: cheaper than a view.
    return torch.empty(size, dtype=torch.int32, device=device).resize_(batch, num_draft + 1)


class _Loaded:
    """The loaded main and combine kernels of one specialisation, launched directly."""

    __slots__ = ("main", "combine")

    def __init__(self, main, combine):
        self.main, self.combine = main, combine


# (device, every pointer's dtype, draft given, BLOCK_N, row alignment) -> _Loaded: what Triton
# specialises the kernel on (all other arguments are do_not_specialize int32 values and pointers).
# Filled by the first launch of each.
_LOADED: dict[tuple, _Loaded] = {}


def _row_alignment(target_ptr, draft_ptr, vocab, stride_tb, stride_tn, stride_db, stride_dn):
    """What Triton specialises the row arguments on: True when all are 16-divisible int32 values
    or 16-byte aligned pointers (contiguous rows with V % 16 == 0), else each one's class."""
    ints = vocab | stride_tb | stride_tn | stride_db | stride_dn  # all >= 0
    if (ints | target_ptr | draft_ptr) % 16 == 0 and ints < 2**31:
        return True
    values = (target_ptr, draft_ptr, vocab, stride_tb, stride_tn, stride_db, stride_dn)
    return tuple((v % 16 == 0, v == 1, v >= 2**31) for v in values)


def chain_speculative_sampling_triton(
    draft_probs: torch.Tensor | None,
    draft_token_ids: torch.Tensor,
    target_probs: torch.Tensor,
    accepted_num: torch.Tensor,
    emitted_num: torch.Tensor,
    seed: torch.Tensor,
    offset: torch.Tensor,
    programs: int | None = None,
) -> torch.Tensor:
    """Same contract as ``reference.chain_speculative_sampling_reference``: returns output_token_ids
    (B, N+1) int32 and adds to ``accepted_num`` / ``emitted_num`` in place.

    ``programs`` overrides the programs per request (tests use it to show the output does not
    depend on it); by default occupancy.launch_plan chooses it.  No host synchronisation, no
    allocation but the output's; after the first call of a specialisation, a direct launch.
    """
    batch, num_draft = draft_token_ids.shape
    vocab = target_probs.shape[2]
    has_draft = draft_probs is not None
    # The row pass needs unit vocabulary stride (16-byte loads); other strides are passed through.
    stride_tb, stride_tn, stride_tv = target_probs.stride()
    if stride_tv != 1:
        target_probs = target_probs.contiguous()
        stride_tb, stride_tn, _ = target_probs.stride()
    if has_draft:
        stride_db, stride_dn, stride_dv = draft_probs.stride()
        if stride_dv != 1:
            draft_probs = draft_probs.contiguous()
            stride_db, stride_dn, _ = draft_probs.stride()
        draft = draft_probs
    else:
        stride_db = stride_dn = 0
        draft = target_probs  # placeholder pointer
    if programs is None:
        programs, per_program = launch_plan(batch, vocab, target_probs.dtype, has_draft)[:2]
    else:
        chunks = num_chunks(vocab)
        per_program = triton.cdiv(chunks, max(1, min(programs, chunks, MAX_PROGRAMS_PER_REQUEST)))
        programs = triton.cdiv(chunks, per_program)  # none without a chunk
    out = _empty_output(batch, num_draft, programs, target_probs.device)
    if batch == 0:
        return out
    stride_ib, stride_in = draft_token_ids.stride()
    seed_per_request = seed.numel() != 1
    lanes, cdf_slot, race_slot0 = _per_num_draft(num_draft)
    args = (target_probs, draft, draft_token_ids, accepted_num, emitted_num, seed, offset, out,
            num_draft, vocab, stride_tb, stride_tn, stride_db, stride_dn, stride_ib, stride_in,
            accepted_num.stride()[0], emitted_num.stride()[0],  # stride() is the cheaper call
            seed.stride()[0] if seed_per_request else 0,
            offset.stride()[0] if offset.numel() != 1 else 0, int(seed_per_request), per_program,
            cdf_slot, race_slot0, has_draft, lanes, GROUP, CHUNK_SIZE)

    direct = triton_launch.direct_launch_target()
    if direct is not None:
        device, stream = direct
        # Seed and offset are int64 and draft_probs has target_probs' dtype (checks.py).
        key = (device, target_probs.dtype, has_draft, lanes, draft_token_ids.dtype,
               accepted_num.dtype, emitted_num.dtype,
               _row_alignment(target_probs.data_ptr(), draft.data_ptr(), vocab, stride_tb,
                              stride_tn, stride_db, stride_dn))
        loaded = _LOADED.get(key)
        if loaded is not None:
            loaded.main.launch(batch, programs, stream, args)
            if programs > 1:
                loaded.combine.launch(batch, 1, stream,
                                      (out, batch, num_draft, programs, MAX_PROGRAMS_PER_REQUEST))
            return out
    main = chain_speculative_sampling_kernel[(batch, programs)](
        *args[:-4], HAS_DRAFT=has_draft, BLOCK_N=lanes, GROUP=GROUP, CHUNK=CHUNK_SIZE,
        **LAUNCH_OPTIONS)
    combine_args = (out, batch, num_draft, programs)
    if programs > 1:
        combine_kernel[(batch,)](*combine_args, BLOCK_P=MAX_PROGRAMS_PER_REQUEST,
                                 **LAUNCH_OPTIONS)
    if direct is not None:  # load the combine kernel now too: a later B may need it
        combine = triton_launch.load(combine_kernel, combine_args, (1,), dict(
            BLOCK_P=MAX_PROGRAMS_PER_REQUEST, **LAUNCH_OPTIONS))
        _LOADED[key] = _Loaded(triton_launch.LoadedKernel(main), combine)
    return out
