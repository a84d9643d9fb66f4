"""Which Philox slot each random number of one block-verification request uses (docs/internals/randomness.md).

N draft positions, K = ceil(V / CHUNK_SIZE) vocabulary chunks:
    slot j,          j < N  : the alignment coin of draft position j, the very slot and rule of token
                              verification, so the accepted counter is the same in both modes
    slot N + t - 1,  1<=t<=N: eta_t, the coin that lets the block stop at t (keep t drafts)
    slot 2N                 : the inverse-CDF uniform inside the winning chunk
    slot 2N + 1 + k, k < K  : the exponential-race uniform of chunk k (one race serves every t:
                              only the row at tau is sampled, and tau depends on the etas alone)
"""

from __future__ import annotations

from ...core.sampling.race import num_chunks


def stop_slot(num_draft: int, t: int) -> int:
    return num_draft + t - 1


def cdf_slot(num_draft: int) -> int:
    return 2 * num_draft


def race_slot(num_draft: int, chunk: int) -> int:
    return 2 * num_draft + 1 + chunk


def num_slots(num_draft: int, vocab: int) -> int:
    return race_slot(num_draft, num_chunks(vocab))
