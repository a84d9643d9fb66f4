"""Which Philox slot each random number of one chain request uses (docs/internals/randomness.md).

N draft positions, K = ceil(V / CHUNK_SIZE) vocabulary chunks:
    slot j,          j < N : the acceptance coin of draft position j
    slot N                 : the inverse-CDF uniform inside the winning chunk
    slot N + 1 + k,  k < K : the exponential-race uniform of chunk k
"""

from __future__ import annotations

from ...core.sampling.race import num_chunks


def cdf_slot(num_draft: int) -> int:
    return num_draft


def race_slot(num_draft: int, chunk: int) -> int:
    return num_draft + 1 + chunk


def num_slots(num_draft: int, vocab: int) -> int:
    return race_slot(num_draft, num_chunks(vocab))
