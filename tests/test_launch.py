"""The launch model (specops/core/occupancy.py, with each sampler's part: chain/occupancy.py and
block/launch.py) and the launchers' host side (specops/chain/launch.py, specops/block/launch.py).

The model picks the programs per row for every batch size; these tests hold it to the two
properties that matter on an H200: the machine is kept busy wherever the work can fill it, and the
predicted time never jumps between neighbouring batch sizes (no occupancy cliffs).
"""

from __future__ import annotations

import pytest
import torch

from specops.block import launch as block_launch
from specops.chain import occupancy as chain_occupancy
from specops.core import occupancy
from specops.core.race import num_chunks

VOCABS = (32000, 128256, 151936)
DTYPES = (torch.float32, torch.float16, torch.bfloat16)
BATCHES = range(1, 4097)
BLOCK_NUM_DRAFT = 4  # block verification: B (N + 1) candidate rows


def chain_plans(vocab, dtype, has_draft):
    return (chain_occupancy.programs_held(dtype, has_draft, vocab),
            chain_occupancy.MAX_PROGRAMS_PER_REQUEST, 1,
            [chain_occupancy.launch_plan(batch, vocab, dtype, has_draft) for batch in BATCHES])


def block_plans(vocab, dtype, has_draft):
    rows = BLOCK_NUM_DRAFT + 1
    return (block_launch.programs_held(dtype, has_draft, vocab), block_launch.MAX_SPLITS, rows,
            [block_launch.launch_plan(batch * rows, vocab, dtype, has_draft) for batch in BATCHES])


@pytest.mark.parametrize("sampler", [chain_plans, block_plans], ids=["chain", "block"])
@pytest.mark.parametrize("has_draft", [True, False])
@pytest.mark.parametrize("dtype", DTYPES)
def test_no_occupancy_cliffs(dtype, has_draft, sampler):
    for vocab in VOCABS:
        chunks = num_chunks(vocab)
        held, max_programs, rows_per_request, plans = sampler(vocab, dtype, has_draft)
        for batch, plan in zip(BATCHES, plans):
            assert 1 <= plan.programs_per_request <= min(chunks, max_programs)
            # Every program has chunks_per_program chunks but the last, which has at least one.
            assert (plan.programs_per_request - 1) * plan.chunks_per_program < chunks
            if batch * rows_per_request * chunks >= occupancy.FILL_CHUNKS_PER_SLOT * held:
                assert plan.busy >= 0.85, (vocab, batch, plan)
        for batch, (before, after) in enumerate(zip(plans, plans[1:]), start=1):
            assert after.time <= 1.3 * before.time, (vocab, batch, before, after)


def test_model_matches_the_figures_it_was_built_from():
    # 56 registers: 7 blocks of 256 per warp, 28 per program: 9 programs (36 warps) per SM.
    assert occupancy.resident_programs(56, 4) == 9
    assert occupancy.resident_programs(64, 4) == 8
    assert occupancy.resident_programs(115, 4) == 4  # the one-pass kernel with float64 keys
    assert occupancy.machine_programs(56, 4) == 132 * 9
    # B = 1, V = 151936: one chunk per program, as many programs as chunks.
    assert chain_occupancy.programs_per_request(1, 151936, torch.bfloat16, True) == 149
    # Many requests: one program per request unless the wave tail says otherwise; busy.
    assert chain_occupancy.programs_per_request(1188, 151936, torch.bfloat16, True) == 1
    assert chain_occupancy.launch_plan(4096, 151936, torch.bfloat16, True).busy > 0.95
    # Block verification: its rows are the requests' candidate rows; the same model.
    assert block_launch.launch_plan(5, 151936, torch.bfloat16, True).programs_per_request == 149
    assert block_launch.launch_plan(4096 * 5, 151936, torch.bfloat16, True).busy > 0.95


# Run with the stand-in CUDA driver (benchmarks/standin_driver.py): Triton's real launch path on CPU
# tensors, counting the kernel binaries loaded. The interpreter must be off, so in a subprocess.
NO_NEW_KERNELS = r'''
import json, sys
import standin_driver
driver = standin_driver.install()
import torch
import specops

VOCAB, NUM_DRAFT = 2048, 3
first, path, verification = sys.argv[1:4]
if path == "binder":  # Triton's own launch path (where the direct one is unavailable)
    from specops.core import triton_launch
    triton_launch.direct_launch_supported = lambda: False


def calls(has_draft):
    """One call per form a decode loop may use: batch sizes on both sides of the split, every seed
    and offset form, strided ids and counters."""
    for batch in (1, 3, 40, 700, 3000):
        target = torch.rand(batch, NUM_DRAFT + 1, VOCAB, dtype=torch.bfloat16)
        draft = torch.rand(batch, NUM_DRAFT, VOCAB, dtype=torch.bfloat16) if has_draft else None
        ids = torch.randint(0, VOCAB, (batch, 2 * NUM_DRAFT))[:, ::2]
        counters = torch.zeros(2 * batch, dtype=torch.int32)
        acc, emit = counters[::2], counters[1::2]
        per_request = torch.arange(batch, dtype=torch.int64)
        for seed, offset in ((None, None), (5, None), (5, 7), (torch.tensor([5]), None),
                             (per_request, None), (per_request, per_request + 1),
                             (torch.tensor([5]), per_request), (None, 3)):
            specops.chain_speculative_sampling(draft, ids, target, acc, emit, seed=seed,
                                               offset=offset, verification=verification)


if first == "warmup":
    specops.warmup("cpu", VOCAB, NUM_DRAFT, torch.bfloat16, draft_probs=(True, False),
                   verification=verification)
else:  # one call
    for has_draft in (True, False):
        target = torch.rand(1, NUM_DRAFT + 1, VOCAB, dtype=torch.bfloat16)
        draft = torch.rand(1, NUM_DRAFT, VOCAB, dtype=torch.bfloat16) if has_draft else None
        specops.chain_speculative_sampling(draft, torch.zeros(1, NUM_DRAFT, dtype=torch.int64),
                                           target, seed=5, verification=verification)
loaded, launches = driver.utils.modules_loaded, driver.utils.launches
for has_draft in (True, False):
    calls(has_draft)
after = driver.utils.modules_loaded
# Rows that are not 16-byte aligned select another kernel: it must be compiled, not the aligned
# one launched on them.
target = torch.rand(2, NUM_DRAFT + 1, VOCAB, dtype=torch.bfloat16)[:, :, 1:]
specops.chain_speculative_sampling(None, torch.zeros(2, NUM_DRAFT, dtype=torch.int64), target,
                                   seed=5, verification=verification)
print(json.dumps({"loaded": loaded, "loaded_after": after - loaded,
                  "launches_after": driver.utils.launches - launches,
                  "loaded_unaligned": driver.utils.modules_loaded - after}))
'''


@pytest.mark.parametrize("first,path,verification", [
    ("warmup", "direct", "token"), ("warmup", "binder", "token"), ("one call", "direct", "token"),
    ("one call", "binder", "token"), ("warmup", "binder", "block"), ("one call", "binder", "block"),
])
def test_nothing_compiles_after_warm_up(first, path, verification):
    import json
    import os
    import subprocess
    import sys

    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    env["PYTHONPATH"] = os.pathsep.join([root, os.path.join(root, "benchmarks"),
                                         env.get("PYTHONPATH", "")])
    env["SPECOPS_BACKEND"] = "triton"  # CPU tensors to the Triton launcher (stand-in driver)
    proc = subprocess.run([sys.executable, "-c", NO_NEW_KERNELS, first, path, verification], capture_output=True,
                          text=True, env=env, cwd=root, timeout=600)
    assert proc.returncode == 0, proc.stderr[-4000:]
    result = json.loads(proc.stdout.strip().splitlines()[-1])
    # Token: the main kernel with and without draft_probs, and the combine kernel. Block: the row
    # pass and the scan kernel, each with and without draft_probs.
    assert result["loaded"] == (3 if verification == "token" else 4), result
    assert result["loaded_after"] == 0 and result["launches_after"] > 80, result
    assert result["loaded_unaligned"] >= 1, result
