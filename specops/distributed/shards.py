"""A rank's vocabulary shard: the values at the draft ids, the exponential race and the exact
masses of rows of which it holds columns [start, start + width), combined over the ranks with
one collective each (docs/semantics.md, "Vocabulary-parallel verification").

The race runs over *pieces*: a shard's columns split at the global multiples of CHUNK_SIZE. A
piece that starts at a chunk's first column is that whole chunk, or its part on this shard, and
draws the chunk's uniform; a piece that starts inside a chunk (the first piece of a shard whose
start is not a multiple of CHUNK_SIZE) draws the uniform of a slot of its own, keyed by its start
(docs/internals/randomness.md). The race over any partition is exact; with chunk-aligned shards every piece
is a whole chunk and every number is the single-device one.
"""

from __future__ import annotations

from typing import NamedTuple

import torch
import torch.distributed as dist

from ..core.sampling import sums
from ..core.sampling.slots import piece_slot, race_slot
from ..core.sampling.probs import sanitize
from ..core.sampling.race import CHUNK_SIZE, chunk_masses, inverse_cdf, num_chunks, race_winner
from ..core.sampling.randomness import uniforms_at
from ..chain.drafts import at_draft_ids
from .comm import all_gather, all_reduce


class Shard(NamedTuple):
    """Columns [start, start + width) of a vocabulary of ``vocab`` tokens, on ``group``."""

    start: int
    width: int  # inside the vocabulary: a padded shard's columns past it are cut off
    vocab: int
    group: object

    @property
    def head(self) -> int:
        """Columns before the first chunk boundary (0 when the start is one)."""
        return min(-self.start % CHUNK_SIZE, self.width)

    def owns(self, ids: torch.Tensor) -> torch.Tensor:
        return (ids >= self.start) & (ids < self.start + self.width)

    def local(self, ids: torch.Tensor) -> torch.Tensor:
        """Global ids as columns of the shard, clamped into it (meaningful where owned)."""
        return (ids - self.start).clamp(0, self.width - 1)


def values_at_ids(shard: Shard, probs: torch.Tensor, ids: torch.Tensor) -> torch.Tensor:
    """This shard's share of sanitised probs[b, j, ids[b, j]]: the value where it owns the id,
    0 elsewhere, so that a SUM over the ranks gives the value (x + 0 is exact): (B, N)."""
    owned = sanitize(at_draft_ids(probs, shard.local(ids)))
    return torch.where(shard.owns(ids), owned, 0.0)


def exchanged_values(shard: Shard, values: torch.Tensor) -> torch.Tensor:
    """The SUM over the ranks of ``values_at_ids`` shares, of several tensors stacked."""
    return all_reduce(values, dist.ReduceOp.SUM, shard.group)


def piece_starts(shard: Shard, device) -> torch.Tensor:
    """The global column each piece starts at: (P,) int64. Built by arithmetic on an arange,
    without a host-to-device copy, so that a CUDA graph can capture it."""
    pieces = int(shard.head > 0) + num_chunks(shard.width - shard.head)
    index = torch.arange(pieces, device=device) - int(shard.head > 0)
    # The head piece (index -1) would start CHUNK_SIZE - head before the shard: it starts at it.
    return (shard.start + shard.head + index * CHUNK_SIZE).clamp(min=shard.start)


def piece_slots(shard: Shard, device) -> torch.Tensor:
    """Each piece's race slot (core/sampling/slots.py): chunk k's for a piece that starts chunk k,
    a slot of its own for one that starts at column ``start`` inside a chunk (so no two pieces of
    any layout share a slot): (P,) int64."""
    starts = piece_starts(shard, device)
    return torch.where(starts % CHUNK_SIZE == 0, race_slot(starts // CHUNK_SIZE),
                       piece_slot(starts))


def piece_masses(shard: Shard, rows: torch.Tensor) -> torch.Tensor:
    """Float32 mass of every piece of the (R, width) rows: (R, P); the pieces after the head are
    chunks, summed as core/sampling/race.py sums them."""
    head = shard.head
    masses = [rows[:, :head].sum(-1, keepdim=True)] if head else []
    if head < shard.width:
        masses.append(chunk_masses(rows[:, head:]))
    return torch.cat(masses, dim=1)


def piece_values(shard: Shard, rows: torch.Tensor, piece: torch.Tensor) -> torch.Tensor:
    """The values of piece ``piece[r]`` of row r, zero-padded to CHUNK_SIZE: (R, CHUNK_SIZE)."""
    batch = rows.shape[0]
    head = shard.head
    body = rows[:, head:]
    body = torch.nn.functional.pad(body, (0, -body.shape[1] % CHUNK_SIZE))
    pieces = body.reshape(batch, body.shape[1] // CHUNK_SIZE, CHUNK_SIZE)  # B = 0 too
    if head:
        first = torch.nn.functional.pad(rows[:, :head], (0, CHUNK_SIZE - head))
        pieces = torch.cat([first[:, None], pieces], dim=1)
    return pieces[torch.arange(batch, device=rows.device), piece]


def race(shard: Shard, rows: torch.Tensor, seed, offset, u_cdf: torch.Tensor) -> torch.Tensor:
    """One token from each of the (M, B, width) rows of B requests, drawn over every rank's
    shard: int64 (M, B), -1 where a row has no positive mass on any rank.

    Each rank runs the race over its own pieces and draws the token inside its winner; one
    all_gather of (key, piece start, token) per row then picks the smallest key, the lower
    piece on ties, as the single-device race picks the lower chunk.
    """
    many, batch, width = rows.shape
    flat = rows.reshape(many * batch, width)
    u_race = uniforms_at(seed, offset, batch, piece_slots(shard, rows.device))
    piece, key = race_winner(piece_masses(shard, flat), -torch.log(u_race.double()).repeat(many, 1))
    starts = piece_starts(shard, rows.device)[piece]
    in_piece = inverse_cdf(piece_values(shard, flat, piece), u_cdf.repeat(many))
    mine = torch.stack([key, starts.double(), (starts + in_piece).double()], dim=-1)
    every = all_gather(mine, shard.group)  # (world, M * B, 3)
    best = every[..., 0].amin(dim=0)
    lowest = torch.where(every[..., 0] == best, every[..., 1], torch.inf).argmin(dim=0)
    token = every[..., 2].gather(0, lowest[None]).squeeze(0).long()
    return torch.where(torch.isfinite(best), token, -1).reshape(many, batch)


def exact_totals(shard: Shard, masses: torch.Tensor) -> torch.Tensor:
    """The exact sum over every rank's pieces of the float32 piece masses (..., P): float64
    (...), one all_reduce of the int64 bins (core/sampling/sums.py: integer sums, so the grouping of the
    pieces over ranks cannot change them)."""
    bins = all_reduce(sums.bins_of(masses), dist.ReduceOp.SUM, shard.group)
    return sums.to_float(sums.normalise(bins))
