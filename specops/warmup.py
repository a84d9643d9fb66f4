"""``specops.warmup``: compile and load, before a decode loop starts, every kernel it can launch
(token, block and tree verification alike)."""

from __future__ import annotations

import itertools
from typing import Iterable, Union

import torch

Choices = Union[bool, Iterable[bool]]


def _choices(value, scalar_types) -> tuple:
    """One value or several (a string is one value)."""
    if isinstance(value, (scalar_types, str)) or not hasattr(value, "__iter__"):
        return (value,)
    return tuple(value)


def warmup(
    device: Union[str, torch.device],
    vocab: int,
    num_draft: Union[int, Iterable[int]],
    dtype: Union[torch.dtype, Iterable[torch.dtype]] = torch.bfloat16,
    *,
    draft_probs: Choices = True,
    ids_dtype: Union[torch.dtype, Iterable[torch.dtype]] = torch.int64,
    counter_dtype: Union[torch.dtype, Iterable[torch.dtype]] = torch.int32,
    verification: Union[str, Iterable[str]] = "token",
    parents_dtype: Union[torch.dtype, Iterable[torch.dtype]] = torch.int64,
) -> int:
    """Compile and load every Triton kernel that ``chain_speculative_sampling`` (and, with
    ``verification="tree"``, ``tree_speculative_sampling``) can launch on ``device`` for these
    settings, so that no call after this one compiles or loads anything.

    A decode loop's calls differ in batch size, seed form (None, an int, a tensor of 1 or B
    seeds), offset form and strides; none of these selects a different kernel (they are runtime
    arguments, and both the single-program and the split launch are loaded together).  What does
    select one: the probability ``dtype``, ``draft_probs`` given (True) or None (False), the draft
    length through next_pow2(N + 1) (pass every ``num_draft`` the loop uses, e.g. ``range(1, 8)``),
    the id and counter dtypes, and whether V and the rows are 16-byte aligned (so pass the model's
    real ``vocab``; contiguous rows are aligned when V % 16 == 0), and ``verification`` ("token",
    "block", "tree", or several).  For "tree", ``num_draft`` is the number of nodes M (the kernel
    is selected by next_pow2(M + 1)), ``ids_dtype`` and ``parents_dtype`` the dtypes of the node
    tokens and parents, and ``counter_dtype`` does not apply (``with_replacement`` selects no
    kernel).  Each argument may be one value or several; every combination is loaded.  Returns
    the number of combinations.

    On a CUDA device with the Triton backend; elsewhere it does nothing and returns 0.
    """
    from .chain.arguments import INDEX_DTYPES, PROB_DTYPES
    from .core.backends import selected_backend

    vocab = _count("vocab", vocab)
    num_drafts = sorted({_count("num_draft", n) for n in _choices(num_draft, int)})
    dtypes = _members("dtype", _choices(dtype, torch.dtype), PROB_DTYPES)
    has_drafts = _members("draft_probs", _choices(draft_probs, bool), (True, False))
    ids_dtypes = _members("ids_dtype", _choices(ids_dtype, torch.dtype), INDEX_DTYPES)
    counter_dtypes = _members("counter_dtype", _choices(counter_dtype, torch.dtype), INDEX_DTYPES)
    modes = _members("verification", _choices(verification, str), ("token", "block", "tree"))
    parents_dtypes = _members("parents_dtype", _choices(parents_dtype, torch.dtype), INDEX_DTYPES)
    device = torch.device(device)
    if selected_backend(device) != "triton":
        return 0
    from .chain.block.launch import block_speculative_sampling_triton
    from .chain.token.launch import chain_speculative_sampling_triton
    from .tree.launch import tree_speculative_sampling_triton

    launchers = {"token": chain_speculative_sampling_triton,
                 "block": block_speculative_sampling_triton}
    count = 0
    for mode in modes:
        fourth = parents_dtypes if mode == "tree" else counter_dtypes
        for dt, n, has_draft, ids_dt, other_dt in itertools.product(
                dtypes, num_drafts, has_drafts, ids_dtypes, fourth):
            ids = torch.zeros(1, n, dtype=ids_dt, device=device)
            seed = torch.zeros(2, dtype=torch.int64, device=device)
            target = torch.zeros(1, n + 1, vocab, dtype=dt, device=device)
            if mode == "tree":  # draft rows: one per node, the root's included
                draft = torch.zeros_like(target) if has_draft else None
                parents = torch.zeros(1, n, dtype=other_dt, device=device)
                tree_speculative_sampling_triton(draft, ids, parents, target, seed[:1], seed[1:])
            else:
                draft = target[:, :n] if has_draft else None
                counters = torch.zeros(2, dtype=other_dt, device=device)
                # Split over two programs too where V has two chunks: token verification's
                # combine kernel.
                for programs in (1, 2):
                    launchers[mode](draft, ids, target, counters[:1], counters[1:], seed[:1],
                                    seed[1:], programs)
            count += 1
    return count


def _count(name: str, value) -> int:
    """A positive int, or a clear error naming the argument."""
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ValueError(f"{name} must be a positive int; got {value!r}")
    return value


def _members(name: str, values: tuple, allowed: tuple) -> tuple:
    """The values, each one of ``allowed``, or a clear error naming the argument."""
    for value in values:
        if value not in allowed:
            spelled = ", ".join(str(a).replace("torch.", "") for a in allowed)
            raise ValueError(f"{name} must be one of {spelled}; got {value!r}")
    return values
