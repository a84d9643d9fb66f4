"""Sampling one token from a row of weights by a chunked exponential race (pure torch, plain).

The rule every sampler of specops uses to draw from a (not necessarily normalised) row r, on every
backend (docs/algorithm.md explains why it is exact and launch-independent):
  * split the vocabulary into chunks of CHUNK_SIZE tokens; chunk k has mass w_k = sum(r[chunk k]);
  * chunk k wins an exponential race with key -log(u_k) / w_k (the smallest key wins, ties go to
    the lower chunk), which picks chunk k with probability w_k / sum(w);
  * inside the winning chunk, the token is the first t with r_t > 0 and cumsum(r)_t > u * w_k.
Chunk masses are float32 sums (of values below probs.PROBABILITY_BOUND, so they never overflow);
race keys and the in-chunk prefix sums are float64. A row's total mass, where a rule needs it, is
``sums.exact_total`` of its chunk masses.
"""

from __future__ import annotations

import math
from array import array

import torch

# Part of the contract: changing it changes which uniform each token sees, so every fixed-seed
# output would change.
CHUNK_SIZE = 1024


def num_chunks(vocab_size: int) -> int:
    return (vocab_size + CHUNK_SIZE - 1) // CHUNK_SIZE


def chunk_masses(rows: torch.Tensor) -> torch.Tensor:
    """Float32 mass of every CHUNK_SIZE-token chunk of each row: (B, V) -> (B, K)."""
    batch, vocab = rows.shape
    full = vocab // CHUNK_SIZE
    masses = [rows[:, : full * CHUNK_SIZE].view(batch, full, CHUNK_SIZE).sum(-1)]
    if vocab % CHUNK_SIZE:
        masses.append(rows[:, full * CHUNK_SIZE :].sum(-1, keepdim=True))
    return torch.cat(masses, dim=1)


def chunk_mass_lists(rows: torch.Tensor) -> list[list[float]]:
    """``chunk_masses`` of rows (R, V) as R lists of Python floats: the same sums of the same
    views of the rows, not joined into a tensor first (for the host paths of small calls)."""
    batch, vocab = rows.shape
    full = vocab // CHUNK_SIZE
    masses = ([[] for _ in range(batch)] if not full else
              rows[:, : full * CHUNK_SIZE].view(batch, full, CHUNK_SIZE).sum(-1).tolist())
    if vocab % CHUNK_SIZE:
        for row, tail in zip(masses, rows[:, full * CHUNK_SIZE :].sum(-1).tolist()):
            row.append(tail)
    return masses


def race_winner(masses: torch.Tensor, exponentials: torch.Tensor):
    """Exponential race over chunks, given -log(u_k) per chunk: (winning chunk, winning key); the
    key is inf when all masses are 0."""
    keys = exponentials / masses.double()  # mass 0 -> +inf: never wins
    key, chunk = keys.min(dim=1)  # min returns the first (lowest) chunk among ties
    return chunk, key


def inverse_cdf(values: torch.Tensor, u: torch.Tensor) -> torch.Tensor:
    """Index in each row of the (B, C) values of a chunk of the first value whose float64 prefix
    sum exceeds u * (the row's float64 total).

    That value is positive: the in-order prefix sum never decreases and grows only at positive
    values. A chunk with mass always has such a value, as u < 1; an empty chunk (whose token is
    discarded) gives the last index, C - 1.
    """
    cdf = values.cumsum(dim=1, dtype=torch.float64)
    threshold = u.double()[:, None] * cdf[:, -1:]
    first = torch.searchsorted(cdf, threshold, right=True).squeeze(1)  # first cdf > threshold
    return first.clamp(max=values.shape[1] - 1)


def chunk_values(rows: torch.Tensor, chunk: torch.Tensor) -> torch.Tensor:
    """The CHUNK_SIZE values of chunk ``chunk[b]`` of row b, zero past the vocabulary: (B, C)."""
    batch, vocab = rows.shape
    chunks_per_row = num_chunks(vocab)
    padded = torch.nn.functional.pad(rows, (0, chunks_per_row * CHUNK_SIZE - vocab))
    chunks = padded.view(batch, chunks_per_row, CHUNK_SIZE)
    return chunks[torch.arange(batch, device=rows.device), chunk]


def token_in_chunk(rows: torch.Tensor, chunk: torch.Tensor, u: torch.Tensor) -> torch.Tensor:
    """``inverse_cdf`` inside chunk ``chunk[b]`` of row b, read in place (no padded copy): (B,)."""
    batch, vocab = rows.shape
    full, tail = divmod(vocab, CHUNK_SIZE)  # whole chunks, and the width of a last partial one
    if tail:
        in_last = inverse_cdf(rows[:, full * CHUNK_SIZE :], u)
        if not full:
            return in_last
    if batch == 0:
        return chunk
    # All windows of CHUNK_SIZE consecutive values of the flattened rows, as a view: whole chunk k
    # of row b is window b * V + k * CHUNK_SIZE.
    windows = rows.reshape(-1).unfold(0, CHUNK_SIZE, 1)
    start = torch.arange(batch, device=rows.device) * vocab + chunk.clamp(max=full - 1) * CHUNK_SIZE
    in_whole = inverse_cdf(windows.index_select(0, start), u)
    return torch.where(chunk == full, in_last, in_whole) if tail else in_whole


def sample_rows(rows: torch.Tensor, u_race: torch.Tensor, u_cdf: torch.Tensor) -> torch.Tensor:
    """One token per row of the (B, V) weights: int64 (B,), -1 where a row has no positive mass.

    u_race: (B, K) uniforms, one per chunk; u_cdf: (B,) the inverse-CDF uniform.
    """
    chunk, key = race_winner(chunk_masses(rows), -torch.log(u_race.double()))
    token = chunk * CHUNK_SIZE + inverse_cdf(chunk_values(rows, chunk), u_cdf)
    return torch.where(torch.isfinite(key), token, -1)


def draw_on_host(row: torch.Tensor, masses: list[float], u_race: list[float], u_cdf: float) -> int:
    """``sample_rows`` for one (V,) row with some positive chunk mass, ``masses`` its chunk
    masses, u_race its K race uniforms: the token."""
    # race_winner on the host: -log(u) from torch.log on the u as the reference lays them out
    # (1-D, like its contiguous (1, K) row), then float64 division (mass 0: +inf, never the
    # smallest) and the first smallest key.
    race = torch.frombuffer(array("d", u_race), dtype=torch.float64)
    keys = [-x / w if w > 0 else math.inf for x, w in zip(torch.log(race).tolist(), masses)]
    start = keys.index(min(keys)) * CHUNK_SIZE
    cdf = row[start : start + CHUNK_SIZE].cumsum(0, dtype=torch.float64)
    threshold = u_cdf * cdf[-1].item()
    return start + min(torch.searchsorted(cdf, threshold, right=True).item(), cdf.numel() - 1)
