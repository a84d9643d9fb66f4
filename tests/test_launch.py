"""The launch model (specops/chain/occupancy.py) and the launcher's host side (specops/chain/launch.py).

The model picks the programs per request for every batch size; these tests hold it to the two
properties that matter on an H200: the machine is kept busy wherever the work can fill it, and the
predicted time never jumps between neighbouring batch sizes (no occupancy cliffs).
"""

from __future__ import annotations

import pytest
import torch

from specops.chain import occupancy
from specops.core.race import num_chunks

VOCABS = (32000, 128256, 151936)
DTYPES = (torch.float32, torch.float16, torch.bfloat16)
BATCHES = range(1, 4097)


@pytest.mark.parametrize("has_draft", [True, False])
@pytest.mark.parametrize("dtype", DTYPES)
def test_no_occupancy_cliffs(dtype, has_draft):
    for vocab in VOCABS:
        chunks = num_chunks(vocab)
        slots = occupancy.slots(dtype, has_draft, vocab)
        plans = [occupancy.launch_plan(batch, vocab, dtype, has_draft) for batch in BATCHES]
        for batch, plan in zip(BATCHES, plans):
            assert 1 <= plan.programs_per_request <= min(chunks, occupancy.MAX_PROGRAMS_PER_REQUEST)
            # Every program has chunks_per_program chunks but the last, which has at least one.
            assert (plan.programs_per_request - 1) * plan.chunks_per_program < chunks
            if batch * chunks >= occupancy.FILL_CHUNKS_PER_SLOT * slots:
                assert plan.busy >= 0.85, (vocab, batch, plan)
        for batch, (before, after) in enumerate(zip(plans, plans[1:]), start=1):
            assert after.time <= 1.3 * before.time, (vocab, batch, before, after)


def test_model_matches_the_figures_it_was_built_from():
    # 56 registers: 7 blocks of 256 per warp, 28 per program: 9 programs (36 warps) per SM.
    assert occupancy.resident_programs(56) == 9
    assert occupancy.resident_programs(64) == 8
    assert occupancy.resident_programs(115) == 4  # the one-pass kernel with float64 keys
    # B = 1, V = 151936: one chunk per program, as many programs as chunks.
    assert occupancy.programs_per_request(1, 151936, torch.bfloat16, True) == 149
    # Many requests: one program per request unless the wave tail says otherwise; busy.
    assert occupancy.programs_per_request(1188, 151936, torch.bfloat16, True) == 1
    assert occupancy.launch_plan(4096, 151936, torch.bfloat16, True).busy > 0.95
