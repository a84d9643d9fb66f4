"""The launchers: the launch model (specops/core/launch/occupancy.py) and the launch plans the samplers
make from their compiled kernels (specops/core/launch/launcher.py), on Triton's real launch path.

Without a GPU the launch-path tests run the stand-in CUDA driver (tests/standin_driver.py:
Triton's launch path on CPU tensors up to the driver's launcher, counting the binaries it loads
and the launches it makes). It needs compiled kernels, so those tests run in subprocesses without
TRITON_INTERPRET (conftest.py sets it for this process).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from specops.core.launch import occupancy
from specops.core.sampling.race import num_chunks

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
VOCABS = (32000, 128256, 151936)
BATCHES = range(1, 4097)


def run_standin(script: str, *args: str, env: dict | None = None, timeout: int = 600) -> dict:
    """Run ``script`` under the stand-in driver; its last line of output is JSON."""
    environment = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    environment["PYTHONPATH"] = os.pathsep.join([ROOT, os.path.join(ROOT, "tests"),
                                                 environment.get("PYTHONPATH", "")])
    environment["SPECOPS_BACKEND"] = "triton"  # CPU tensors to the Triton launchers
    environment.update(env or {})
    preamble = "import standin_driver\ndriver = standin_driver.install()\n"
    proc = subprocess.run([sys.executable, "-c", preamble + script, *args], capture_output=True,
                          text=True, env=environment, cwd=ROOT, timeout=timeout)
    assert proc.returncode == 0, proc.stderr[-4000:]
    return json.loads(proc.stdout.strip().splitlines()[-1])


# ---------------------------------------------------------------------------------- the model

@pytest.mark.parametrize("registers,sms", [(56, 132), (64, 132), (104, 132), (64, 78),
                                           (40, 108)])
@pytest.mark.parametrize("rows_per_request", [1, 5])  # token verification; block, N = 4
def test_no_occupancy_cliffs(registers, sms, rows_per_request):
    """For any kernel and device: the machine is kept busy wherever the work can fill it, and the
    predicted time never jumps between neighbouring batch sizes."""
    gpu = occupancy.Device(sms=sms, registers_per_sm=65536, shared_per_sm=232448,
                           threads_per_sm=2048)
    slots = sms * occupancy.resident_programs(registers, 4, 1024, gpu)
    for vocab in VOCABS:
        chunks = num_chunks(vocab)
        plans = [occupancy.best_plan(batch * rows_per_request, chunks, slots, 4096, 256)
                 for batch in BATCHES]
        for batch, plan in zip(BATCHES, plans):
            assert 1 <= plan.programs_per_row <= min(chunks, 256)
            # Every program has chunks_per_program chunks but the last, which has at least one.
            assert (plan.programs_per_row - 1) * plan.chunks_per_program < chunks
            if batch * rows_per_request * chunks >= occupancy.FILL_CHUNKS_PER_SLOT * slots:
                assert plan.busy >= 0.85, (vocab, batch, plan)
        for batch, (before, after) in enumerate(zip(plans, plans[1:]), start=1):
            assert after.time <= 1.3 * before.time, (vocab, batch, before, after)


def test_resident_programs_follow_each_limit():
    # Registers are given to warps in blocks of 256: 56 registers -> 7 blocks per warp.
    gpu = occupancy.Device(sms=1, registers_per_sm=65536, shared_per_sm=232448,
                           threads_per_sm=2048)
    assert occupancy.resident_programs(56, 4, 1024, gpu) == 65536 // (7 * 256 * 4)
    assert occupancy.resident_programs(16, 4, 1024, gpu) == 16  # threads: 2048 / 128
    assert occupancy.resident_programs(16, 4, 100 * 1024, gpu) == 2  # shared memory
    assert occupancy.resident_programs(255, 32, 0, gpu) == 1  # never fewer than one


PLAN_SCRIPT = r'''
import json, torch, specops
from specops.chain.token import launch
from specops.core.launch import occupancy
from sass import resources
B, N, V = 40, 3, 128256
specops.chain_speculative_sampling(torch.rand(B, N, V), torch.zeros(B, N, dtype=torch.long),
                                   torch.rand(B, N + 1, V), seed=1)
(kernel,) = launch.MAIN._resources.values()
gpu = occupancy.device(kernel.device)
print(json.dumps(dict(
    registers=kernel.registers, cubin_registers=resources(kernel.kernel.asm["cubin"])["REG"],
    sms=gpu.sms, planned=occupancy.programs_per_row(kernel, B, 126, 4 * 1024, 256),
    launched=driver.utils.grids[-1])))
'''


@pytest.mark.sm90
def test_launch_plans_come_from_the_compiled_kernel_and_the_device():
    sms132 = run_standin(PLAN_SCRIPT)
    sms66 = run_standin(PLAN_SCRIPT, env={"STANDIN_SMS": "66"})
    for report in (sms132, sms66):
        # The registers the driver reports for the loaded kernel (its cubin's), not a table.
        assert report["registers"] == report["cubin_registers"] > 0
        assert report["launched"][:2] == [40, report["planned"]]
    assert (sms132["sms"], sms66["sms"]) == (132, 66)
    # The device's SM count changes the plan: half the slots, fewer programs per request.
    assert sms66["planned"] < sms132["planned"]


# ------------------------------------------------------------------------------ the launcher

NO_NEW_KERNELS = r'''
import json, sys
import torch, triton
import specops
import specops.varlen

VOCAB, NUM_DRAFT = 2048, 3
first, verification, logits, layout = sys.argv[1:5]
step = logits == "logits+step"  # with a logit bias, a grammar mask and every penalty
logits = logits.startswith("logits")
flattened = layout == "flattened"  # specops.varlen's calls, each request's rows stacked
# From logits, int64 counters: the ops count in int32 of their own, whatever the caller's dtype.
counter_dtype = torch.int64 if logits else torch.int32


def call(draft, ids, target, acc, emit, **kwargs):
    """The public function the loop uses; from logits, drafts from probabilities and from
    logits alike, with every parameter on; a tree: a chain of nodes, with replacement on even
    batches and without on odd ones (with_replacement selects no kernel)."""
    batch, n = ids.shape
    vocab = target.shape[-1]
    if step:
        kwargs.update(logit_bias=torch.zeros(batch, vocab),
                      allowed_token_bitmask=torch.full((batch, n + 1, -(-vocab // 32)), -1,
                                                       dtype=torch.int32),
                      repetition_penalty=1.2,  # one for all; and one a request (a stride)
                      frequency_penalty=torch.full((batch,), 0.1),
                      output_token_counts=torch.zeros(batch, vocab, dtype=torch.int32),
                      prompt_token_mask=torch.zeros(batch, vocab, dtype=torch.bool))
    if verification in ("tree", "traversal"):
        rule = {"verification": "traversal" if verification == "traversal" else "token"}
        if draft is not None:
            draft = torch.cat([draft, draft[:, :1]], dim=1)  # a row per node, the root's included
        parents = torch.arange(n).expand(batch, n)
        if not logits:
            specops.tree_speculative_sampling(draft, ids, parents, target,
                                              with_replacement=batch % 2 == 0, **rule, **kwargs)
            return
        for source in (("probs", "logits") if draft is not None else (None,)):
            specops.tree_speculative_sampling_from_logits(
                draft if source == "probs" else None, ids, parents, target, temperature=0.7,
                top_k=5, top_p=0.9, min_p=0.01, draft_logits=draft if source == "logits" else None,
                with_replacement=batch % 2 == 0, **rule, **kwargs)
        return
    if flattened:
        rows = lambda t: None if t is None else t.reshape(-1, t.shape[-1])  # noqa: E731
        layout = (torch.arange(batch + 1) * n, n)
        if "allowed_token_bitmask" in kwargs:
            kwargs["allowed_token_bitmask"] = rows(kwargs["allowed_token_bitmask"])
        if not logits:
            specops.varlen.chain_speculative_sampling(rows(draft), ids.reshape(-1), rows(target),
                                                      *layout, acc, emit,
                                                      verification=verification, **kwargs)
            return
        for source in (("probs", "logits") if draft is not None else (None,)):
            specops.varlen.chain_speculative_sampling_from_logits(
                rows(draft) if source == "probs" else None, ids.reshape(-1), rows(target),
                *layout, acc, emit, temperature=0.7, top_k=5, top_p=0.9, min_p=0.01,
                draft_logits=rows(draft) if source == "logits" else None,
                verification=verification, **kwargs)
        return
    if not logits:
        specops.chain_speculative_sampling(draft, ids, target, acc, emit,
                                           verification=verification, **kwargs)
        return
    for source in (("probs", "logits") if draft is not None else (None,)):
        specops.chain_speculative_sampling_from_logits(
            draft if source == "probs" else None, ids, target, acc, emit, temperature=0.7,
            top_k=5, top_p=0.9, min_p=0.01, draft_logits=draft if source == "logits" else None,
            verification=verification, **kwargs)


def calls(has_draft):
    """One call per form a decode loop may use: batch sizes on both sides of the split, every seed
    and offset form, strided ids and counters."""
    for batch in ((1, 3, 40, 700) if logits else (1, 3, 40, 700, 3000)):
        target = torch.rand(batch, NUM_DRAFT + 1, VOCAB, dtype=torch.bfloat16)
        draft = torch.rand(batch, NUM_DRAFT, VOCAB, dtype=torch.bfloat16) if has_draft else None
        ids = torch.randint(0, VOCAB, (batch, 2 * NUM_DRAFT))[:, ::2]
        counters = torch.zeros(2 * batch, dtype=counter_dtype)
        acc, emit = counters[::2], counters[1::2]
        per_request = torch.arange(batch, dtype=torch.int64)
        for seed, offset in ((None, None), (5, None), (5, 7), (torch.tensor([5]), None),
                             (per_request, None), (per_request, per_request + 1),
                             (torch.tensor([5]), per_request), (None, 3)):
            call(draft, ids, target, acc, emit, seed=seed, offset=offset)


if first == "warmup":
    specops.warmup("cpu", VOCAB, NUM_DRAFT, torch.bfloat16, draft_probs=(True, False),
                   verification=verification, logits=logits, flattened=flattened,
                   counter_dtype=counter_dtype, logit_bias=step, allowed_token_bitmask=step, penalties=step,
                   prompt_token_mask=step)
else:  # one call of each kind
    for has_draft in (True, False):
        target = torch.rand(1, NUM_DRAFT + 1, VOCAB, dtype=torch.bfloat16)
        draft = torch.rand(1, NUM_DRAFT, VOCAB, dtype=torch.bfloat16) if has_draft else None
        call(draft, torch.zeros(1, NUM_DRAFT, dtype=torch.int64), target, None, None, seed=5)
loaded, launches = driver.utils.modules_loaded, driver.utils.launches
for has_draft in (True, False):
    calls(has_draft)
after, after_launches = driver.utils.modules_loaded, driver.utils.launches
# Rows that are not 16-byte aligned select another kernel: a load the count above would see.
target = torch.rand(2, NUM_DRAFT + 1, VOCAB, dtype=torch.bfloat16)[:, :, 1:]
if verification in ("tree", "traversal"):
    call(None, torch.zeros(2, NUM_DRAFT, dtype=torch.int64), target, None, None, seed=5)
else:
    specops.chain_speculative_sampling(None, torch.zeros(2, NUM_DRAFT, dtype=torch.int64),
                                       target, seed=5, verification=verification)
print(json.dumps({"loaded": loaded, "loaded_after": after - loaded,
                  "launches_after": after_launches - launches,
                  "loaded_unaligned": driver.utils.modules_loaded - after}))
'''


@pytest.mark.sm90
@pytest.mark.parametrize("first,verification,logits,layout", [
    ("warmup", "token", "probs", "padded"), ("one call", "token", "probs", "padded"),
    ("warmup", "block", "probs", "padded"), ("one call", "block", "probs", "padded"),
    ("warmup", "token", "logits", "padded"), ("warmup", "block", "logits", "padded"),
    ("warmup", "tree", "probs", "padded"), ("one call", "tree", "probs", "padded"),
    ("warmup", "tree", "logits", "padded"), ("warmup", "traversal", "probs", "padded"),
    ("warmup", "token", "logits+step", "padded"), ("warmup", "block", "logits+step", "padded"),
    ("warmup", "tree", "logits+step", "padded"), ("warmup", "token", "probs", "flattened"),
])
def test_nothing_compiles_after_warm_up(first, verification, logits, layout):
    result = run_standin(NO_NEW_KERNELS, first, verification, logits, layout)
    # Token: the main kernel with and without draft_probs. Block: the row pass and the scan
    # kernel, each with and without draft_probs. From logits, token: the row statistics kernel,
    # and the main kernel reading logits with drafts from probabilities, from logits and neither;
    # block: the statistics kernel, and the row pass and the scan for each source of drafts.
    # Tree: its one kernel, with and without draft_probs; from logits, the statistics kernel and
    # the tree kernel reading logits with drafts from probabilities, from logits and neither.
    # Traversal: its kernel with draft_probs, the tree kernel without (the token rule's).
    # From logits, every mode also loads the entropy pass typical acceptance reads. With step 0
    # on, the target's statistics kernel and the main kernels apply it (the draft logits'
    # statistics kernel does not): one more each for chains and trees.
    expected = {("token", "logits+step"): 6, ("token", "probs"): 2, ("block", "probs"): 4, ("token", "logits"): 5,
                ("block", "logits"): 8, ("tree", "probs"): 2, ("tree", "logits"): 5,
                ("traversal", "probs"): 2, ("tree", "logits+step"): 6}
    if (verification, logits) in expected and layout == "padded":
        assert result["loaded"] == expected[verification, logits], result
    assert result["loaded_after"] == 0 and result["launches_after"] > 60, result
    assert result["loaded_unaligned"] >= 1, result


@pytest.mark.sm90
def test_host_overhead_benchmark_runs():
    # The checkout on PYTHONPATH: a script's own folder, not the checkout, heads its sys.path.
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    env["PYTHONPATH"] = os.pathsep.join(p for p in (ROOT, env.get("PYTHONPATH")) if p)
    proc = subprocess.run([sys.executable, "benchmarks/host_overhead.py", "--rounds", "1",
                           "--calls", "2"], capture_output=True, text=True, cwd=ROOT, env=env,
                          timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    for entry in ("kernel[grid], same kernel", "public function, seed tensor",
                  "public function, seed int", "registered op", "public function, torch.compile",
                  "CUDA graph replay: skipped (no GPU)", "modules loaded after warm-up: 0"):
        assert entry in proc.stdout, proc.stdout
