"""The collectives vocabulary-parallel verification makes, and the layout exchange every call
starts with.

Every collective goes through ``all_gather`` / ``all_reduce`` / ``broadcast`` here, plain
torch.distributed calls on tensors of O(B * (N + 1)) elements, never O(V) (docs/api.md,
"Vocabulary-parallel verification", counts them). The layout exchange comes first: each rank's
shard, shapes and argument kinds, fingerprints of its seeds, offsets and draft ids, or the argument
its local checks refused, in one all_gather of a fixed size, so that every rank raises the same
ValueError before a collective of a size the ranks disagree on could hang, or ranks given other
seeds or drafts return other tokens.
"""

from __future__ import annotations

from collections import namedtuple
from typing import NamedTuple

import torch
import torch.distributed as dist


def all_gather(tensor: torch.Tensor, group) -> torch.Tensor:
    """Every rank's ``tensor`` (same shape on every rank), stacked in group-rank order:
    (world, *shape)."""
    parts = [torch.empty_like(tensor) for _ in range(dist.get_world_size(group))]
    dist.all_gather(parts, tensor.contiguous(), group=group)
    return torch.stack(parts)


def all_reduce(tensor: torch.Tensor, op, group) -> torch.Tensor:
    """A copy of ``tensor`` reduced over the group with ``op``."""
    reduced = tensor.clone(memory_format=torch.contiguous_format)
    dist.all_reduce(reduced, op=op, group=group)
    return reduced


def broadcast_from_first(tensor: torch.Tensor, group) -> torch.Tensor:
    """The group's first rank's ``tensor`` on every rank."""
    shared = tensor.clone(memory_format=torch.contiguous_format)
    dist.broadcast(shared, src=dist.get_global_rank(group, 0), group=group)
    return shared


def resolve_group(group):
    """The process group a call runs on: ``group``, or the world when None."""
    if not dist.is_initialized():
        raise ValueError("group: torch.distributed is not initialised; call "
                         "torch.distributed.init_process_group first")
    group = dist.group.WORLD if group is None else group
    if dist.get_rank(group) < 0:
        raise ValueError("group: this process is not a member of the process group it passed")
    return group


# ------------------------------------------------------------------------------- the layout

# The arguments a refused call can name; a rank's record carries the index of the one its local
# checks named, so that every other rank can name it too.
ARGUMENTS = ("draft_probs", "draft_token_ids", "target_probs", "target_logits", "draft_logits",
             "maybe_output_accepted_token_num", "maybe_output_emitted_draft_token_num", "seed",
             "offset", "generator", "verification", "vocab_start", "vocab_size", "temperature",
             "top_k", "top_p", "min_p", "draft_temperature", "draft_top_k", "draft_top_p",
             "draft_min_p", "logit_bias", "allowed_token_bitmask", "repetition_penalty",
             "frequency_penalty", "presence_penalty", "output_token_counts", "prompt_token_mask",
             "processing_order", "logprobs", "num_top_logprobs", "acceptance",
             "posterior_threshold", "posterior_alpha", "acceptance_rate")

# The arguments whose values every rank must pass the same: ranks that differ would draw other
# numbers, verify other drafts or process other rows, and return other tokens. Their fingerprints
# (two each, 0 where not given or drawn) come after the shapes, which must agree for the
# fingerprints to compare like with like. (A shard's logit bias, counts and prompt mask are its
# own columns: they differ by rank.)
SAME_ARGUMENTS = ("seed", "offset", "draft_token_ids", "temperature", "top_k", "top_p", "min_p",
                  "draft_temperature", "draft_top_k", "draft_top_p", "draft_min_p",
                  "repetition_penalty", "frequency_penalty", "presence_penalty",
                  "allowed_token_bitmask", "posterior_threshold", "posterior_alpha",
                  "acceptance_rate")
SAME = tuple((name, (f"{name}_print", f"{name}_print2")) for name in SAME_ARGUMENTS)

# What one rank tells the others before any work: its shard and the call's shape and kind (every
# field an int; the ranks' records must agree on all but the shard), then the fingerprints.
_FIELDS = (
    ("refused", 0),  # 1 + the index in ARGUMENTS of the argument its checks refused; 0: none
    ("vocab_start", 0),
    ("width", 0),  # V_rank: the shard's columns, padding included
    ("batch", 0),
    ("num_draft", 0),
    ("vocab_size", -1),  # -1: not given (the shards' total)
    ("dtype", 0),
    ("draft", 0),  # 0: none (one-hot drafts), 1: draft_probs, 2: draft_logits
    ("verification", 0),  # 0: token, 1: block
    ("seed_drawn", 0),  # 1: seed=None, drawn on the first rank and broadcast
    ("searches", 0),  # bit 0: top-k thresholds searched, bit 1: top-p thresholds
    ("seeds", 1),  # elements of the seed and offset tensors: the seed broadcast's size
    ("offsets", 1),
    ("validation", 0),  # SPECOPS_VALIDATE: its checks after the exchange raise on all or none
    ("step", 0),  # from logits: which of the sampling step's arguments are given, and the order
    ("bitmask_words", 0),  # the grammar mask's words per row (0: none)
    ("logprobs", 0),  # 0: none, 1: "processed", 2: "raw"
    ("num_top", 0),  # num_top_logprobs
)
Record = namedtuple("Record", [name for name, _ in _FIELDS] +
                    [field for _, fields in SAME for field in fields],
                    defaults=[value for _, value in _FIELDS] + [0] * (2 * len(SAME)))


# Fields every rank must agree on, and the argument an error then names.
AGREED = (("batch", "target_probs", "batch_size"), ("num_draft", "target_probs",
                                                    "num_speculate_tokens"),
          ("vocab_size", "vocab_size", "vocab_size"), ("dtype", "target_probs", "dtype"),
          ("draft", "draft_probs", "the draft's source (draft_probs, draft_logits or neither)"),
          ("verification", "verification", "verification"), ("seed_drawn", "seed",
                                                             "seed=None or a seed"),
          ("searches", "top_k", "which of top_k / top_p (or the draft's) are given"),
          ("seeds", "seed", "the number of seeds"), ("offsets", "offset", "the number of offsets"),
          ("validation", "SPECOPS_VALIDATE", "whether validation mode is on"),
          ("step", "logit_bias", "which of the sampling step's arguments are given (logit_bias, "
           "allowed_token_bitmask, the penalties and their counts, the draft's parameters), "
           "processing_order or the acceptance rule"),
          ("bitmask_words", "allowed_token_bitmask", "its number of words per row"),
          ("logprobs", "logprobs", "logprobs"), ("num_top", "num_top_logprobs",
                                                 "num_top_logprobs"))
_FIRST_PRINT = Record._fields.index("seed_print")

# SplitMix64's constants as int64: its finaliser makes the fingerprints' weights.
_SPLITMIX = (-7046029254386353131, -4658895280553007687, -7723592293110705685)


def _weights(length: int, device: torch.device) -> torch.Tensor:
    """Two rows of odd pseudo-random int64 weights, one column per position: (2, length),
    position k's the same whatever the length."""
    z = torch.arange(1, 2 * length + 1, dtype=torch.int64, device=device) * _SPLITMIX[0]
    z = (z ^ (z >> 30)) * _SPLITMIX[1]  # int64 products wrap modulo 2**64 on every backend
    z = (z ^ (z >> 27)) * _SPLITMIX[2]
    return ((z ^ (z >> 31)) | 1).view(length, 2).T


def _as_integers(values: torch.Tensor) -> torch.Tensor:
    """int64 values that are equal exactly where the op reads equal values: integers as they
    are, floating values (the sampling parameters) by their bits as float32, the precision the
    op reads them in."""
    if values.is_floating_point():
        return values.float().view(torch.int32).to(torch.int64)
    return values.to(torch.int64)


def fingerprints(values, device: torch.device) -> torch.Tensor:
    """Two fingerprints of each tensor of ``values`` (None: 0 and 0): the sums of its flattened
    values times two rows of weights, modulo 2**64: (2 * len(values),) int64, computed on
    ``device`` so that the host reads nothing before the exchange.

    Tensors that differ at one position always differ here (an odd weight is invertible modulo
    2**64); differences at several positions cancel only if they happen to cancel against
    pseudo-random weights, a chance of about 2**-64 a sum for any pattern not built against them
    (swapped or shifted ids, or +1 / -2 / +1 runs, which plain and position-weighted sums miss,
    are caught like any other). Equal values give equal sums on every rank: integer sums do not
    depend on their order. The values themselves are not gathered: their number depends on B, on
    which the ranks may yet disagree, and the exchange is one gather of a fixed size."""
    parts = [torch.zeros(0, dtype=torch.int64, device=device) if value is None
             else _as_integers(value.reshape(-1).to(device)) for value in values]
    flat = torch.cat(parts)
    weighted = flat * _weights(flat.numel(), device)
    sums = [part.sum(dim=-1) for part in weighted.split([p.numel() for p in parts], dim=1)]
    return torch.stack(sums).reshape(-1)


def refused_index(error: Exception) -> int:
    """1 + the index in ARGUMENTS of the argument an error message starts with; the names the
    checks use start every message (``"target_probs must have ..."``)."""
    words = str(error).split()
    first = words[0].strip(":,") if words else ""
    return 1 + ARGUMENTS.index(first) if first in ARGUMENTS else 1 + ARGUMENTS.index("target_probs")


class Layout(NamedTuple):
    """The checked layout: the global vocabulary and this rank's shard in it."""

    vocab_size: int
    vocab_start: int
    width: int  # this rank's columns inside [0, vocab_size): padding cut off


def exchange_layout(record: Record, error: Exception | None, names: dict, group,
                    device: torch.device, same=None) -> Layout | None:
    """Gather every rank's record and check them together; every rank raises the same
    ValueError (a rank whose own checks failed raises its own error). ``same``: the tensors of
    the SAME arguments (each None where drawn; None when refused), whose fingerprints fill the
    record's. None while a CUDA graph is being captured: a capture cannot read the records on the
    host, and runs after an eager warm-up call that checked the same layout (docs/recipes.md)."""
    if device.type == "cuda" and torch.cuda.is_current_stream_capturing():
        if error is not None:
            raise error
        return None
    mine = torch.cat([torch.tensor(list(record)[:_FIRST_PRINT], dtype=torch.int64, device=device),
                      fingerprints(same or (None,) * len(SAME), device)])
    table = [Record(*row) for row in all_gather(mine, group).tolist()]
    if error is not None:
        raise error
    return check_layout(table, dist.get_rank(group), names)


def check_layout(table: list, rank: int, names: dict) -> Layout:
    """The layout the records describe, or the ValueError every rank raises. ``names`` maps the
    ARGUMENTS to the names this function's caller used."""
    for other, row in enumerate(table):
        if row.refused:
            name = names.get(ARGUMENTS[row.refused - 1], ARGUMENTS[row.refused - 1])
            raise ValueError(f"{name} was refused on rank {other} (that rank raised the error "
                             "saying why); every rank must pass valid arguments")
    first = table[0]
    for field, argument, what in AGREED:
        values = [getattr(row, field) for row in table]
        if len(set(values)) > 1:
            raise ValueError(f"{names.get(argument, argument)}: the ranks disagree on {what}; "
                             f"got {values} on ranks 0..{len(table) - 1}")
    for argument, fields in SAME:
        prints = [tuple(getattr(row, field) for field in fields) for row in table]
        others = [r for r, p in enumerate(prints) if p != prints[0]]
        if others:
            name = names.get(argument, argument)
            raise ValueError(f"{name}: the ranks disagree on its values (every rank must pass the "
                             f"same {name}); rank(s) {others} passed other values than rank 0")
    vocab = first.vocab_size if first.vocab_size >= 0 else sum(row.width for row in table)
    spans = [f"[{row.vocab_start}, {row.vocab_start + row.width}) on rank {r}"
             for r, row in enumerate(table)]
    for other, row in enumerate(table):
        if not 0 <= row.vocab_start < vocab:
            raise ValueError(f"vocab_start must be in [0, vocab_size) = [0, {vocab}); got "
                             f"{row.vocab_start} on rank {other}")
    ordered = sorted(table, key=lambda row: row.vocab_start)
    ends = [row.vocab_start + row.width for row in ordered]
    tiles = all(nxt.vocab_start == end for nxt, end in zip(ordered[1:], ends))
    if not tiles or ends[-1] < vocab:
        raise ValueError(f"vocab_start: the shards must tile [0, vocab_size) = [0, {vocab}) "
                         f"without gap or overlap (only the last may run past it); got "
                         f"{', '.join(spans)}")
    mine = table[rank]
    return Layout(vocab, mine.vocab_start, min(mine.width, vocab - mine.vocab_start))
