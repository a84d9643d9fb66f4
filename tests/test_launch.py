"""The launchers: the launch model (specops/core/occupancy.py) and the one launcher every sampler
uses (specops/core/launcher.py), on Triton's real launch path.

Without a GPU the launch-path tests run the stand-in CUDA driver (benchmarks/standin_driver.py:
Triton's launch path up to the final C call, on CPU tensors, counting the binaries it loads and
the launches it makes). It needs compiled kernels, so those tests run in subprocesses without
TRITON_INTERPRET (conftest.py sets it for this process).
"""

from __future__ import annotations

import concurrent.futures
import json
import os
import subprocess
import sys

import pytest
import torch

from specops.core import occupancy
from specops.core.race import num_chunks

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
VOCABS = (32000, 128256, 151936)
BATCHES = range(1, 4097)


def run_standin(script: str, *args: str, env: dict | None = None, timeout: int = 600) -> dict:
    """Run ``script`` under the stand-in driver; its last line of output is JSON."""
    environment = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    environment["PYTHONPATH"] = os.pathsep.join([ROOT, os.path.join(ROOT, "benchmarks"),
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
from specops.core import occupancy
from sass_budget import resources
B, N, V = 40, 3, 128256
specops.chain_speculative_sampling(torch.rand(B, N, V), torch.zeros(B, N, dtype=torch.long),
                                   torch.rand(B, N + 1, V), seed=1)
(compiled,) = launch.MAIN._compiled.values()
gpu = occupancy.device(compiled.device)
print(json.dumps(dict(
    registers=compiled.registers, cubin_registers=resources(compiled.kernel.asm["cubin"])["REG"],
    sms=gpu.sms, planned=occupancy.programs_per_row(compiled, B, 126, 4 * 1024, 256),
    launched=driver.utils.grids[-1])))
'''


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

VOCAB, NUM_DRAFT = 2048, 3
first, path, verification, logits = sys.argv[1:5]
logits = logits == "logits"


def call(draft, ids, target, acc, emit, **kwargs):
    """The public function the loop uses; from logits, drafts from probabilities and from
    logits alike, with every parameter on; a tree: a chain of nodes, with replacement on even
    batches and without on odd ones (with_replacement selects no kernel)."""
    if verification == "tree":
        batch, n = ids.shape
        if draft is not None:
            draft = torch.cat([draft, draft[:, :1]], dim=1)  # a row per node, the root's included
        specops.tree_speculative_sampling(draft, ids, torch.arange(n).expand(batch, n), target,
                                          with_replacement=batch % 2 == 0, **kwargs)
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
        counters = torch.zeros(2 * batch, dtype=torch.int32)
        acc, emit = counters[::2], counters[1::2]
        per_request = torch.arange(batch, dtype=torch.int64)
        for seed, offset in ((None, None), (5, None), (5, 7), (torch.tensor([5]), None),
                             (per_request, None), (per_request, per_request + 1),
                             (torch.tensor([5]), per_request), (None, 3)):
            call(draft, ids, target, acc, emit, seed=seed, offset=offset)


if first == "warmup":
    specops.warmup("cpu", VOCAB, NUM_DRAFT, torch.bfloat16, draft_probs=(True, False),
                   verification=verification, logits=logits)
else:  # one call of each kind
    for has_draft in (True, False):
        target = torch.rand(1, NUM_DRAFT + 1, VOCAB, dtype=torch.bfloat16)
        draft = torch.rand(1, NUM_DRAFT, VOCAB, dtype=torch.bfloat16) if has_draft else None
        call(draft, torch.zeros(1, NUM_DRAFT, dtype=torch.int64), target, None, None, seed=5)
seen = []
if path == "hooked":  # launch hooks set: every launch takes kernel[grid], which calls them
    hook = lambda metadata: seen.append(1)
    if not hasattr(triton, "knobs"):  # releases before 3.4 keep the hook on CompiledKernel
        triton.compiler.CompiledKernel.launch_enter_hook = hook
    elif hasattr(triton.knobs.runtime.launch_enter_hook, "add"):  # a chain of hooks
        triton.knobs.runtime.launch_enter_hook.add(hook)
    else:
        triton.knobs.runtime.launch_enter_hook = hook
loaded, launches = driver.utils.modules_loaded, driver.utils.launches
for has_draft in (True, False):
    calls(has_draft)
after, after_launches, hook_calls = driver.utils.modules_loaded, driver.utils.launches, len(seen)
# Rows that are not 16-byte aligned select another kernel: it must be compiled, not the aligned
# one launched on them.
target = torch.rand(2, NUM_DRAFT + 1, VOCAB, dtype=torch.bfloat16)[:, :, 1:]
if verification == "tree":
    call(None, torch.zeros(2, NUM_DRAFT, dtype=torch.int64), target, None, None, seed=5)
else:
    specops.chain_speculative_sampling(None, torch.zeros(2, NUM_DRAFT, dtype=torch.int64),
                                       target, seed=5, verification=verification)
print(json.dumps({"loaded": loaded, "loaded_after": after - loaded,
                  "launches_after": after_launches - launches, "hook_calls": hook_calls,
                  "loaded_unaligned": driver.utils.modules_loaded - after}))
'''


@pytest.mark.parametrize("first,path,verification,logits", [
    ("warmup", "direct", "token", "probs"), ("one call", "direct", "token", "probs"),
    ("warmup", "hooked", "token", "probs"), ("warmup", "direct", "block", "probs"),
    ("one call", "hooked", "block", "probs"), ("warmup", "direct", "token", "logits"),
    ("warmup", "direct", "block", "logits"), ("warmup", "direct", "tree", "probs"),
    ("one call", "hooked", "tree", "probs"),
])
def test_nothing_compiles_after_warm_up(first, path, verification, logits):
    result = run_standin(NO_NEW_KERNELS, first, path, verification, logits)
    # Token: the main kernel with and without draft_probs. Block: the row pass and the scan
    # kernel, each with and without draft_probs. From logits, token: the row statistics kernel,
    # and the main kernel reading logits with drafts from probabilities, from logits and neither;
    # block: the statistics kernel, and the row pass and the scan for each source of drafts.
    # Tree: its one kernel, with and without draft_probs.
    expected = {("token", "probs"): 2, ("block", "probs"): 4, ("token", "logits"): 4,
                ("block", "logits"): 7, ("tree", "probs"): 2}
    if (verification, logits) in expected:
        assert result["loaded"] == expected[verification, logits], result
    assert result["loaded_after"] == 0 and result["launches_after"] > 60, result
    assert result["hook_calls"] == (result["launches_after"] if path == "hooked" else 0), result
    assert result["loaded_unaligned"] >= 1, result


# Each variant differs from the one before it in one thing Triton specialises on. The script's
# argument picks the verification: token (with the tree) or block, which share no kernel but the
# statistics one, whose every key field varies within each.
KEY_SCRIPT = r'''
import json, sys, torch, specops
from specops.chain.token import launch as token
from specops.chain.block import launch as block
from specops.core import logits_launch
from specops.tree import launch as tree

N, V = 3, 2048
launched = []
for kernel in (token.MAIN, token.MAIN_FROM_LOGITS, block.ROW_PASS,
               block.ROW_PASS_FROM_LOGITS, block.SCAN, logits_launch.STATISTICS, tree.KERNEL):
    real = kernel.launch
    def record(grid, compiled, args, constexprs, direct=None, stream=None, kernel=kernel,
               real=real):
        launched.append((kernel, compiled, args, constexprs))
        real(grid, compiled, args, constexprs, direct, stream)
    kernel.launch = record


def variant(dtype=torch.float32, ids=torch.int64, acc=torch.int32, emit=torch.int32, draft=True,
            n=N, vocab=V, shift_target=False, shift_draft=False, batch=2, wide=False,
            verification="token"):
    target = torch.rand(batch, n + 1, vocab + 1, dtype=dtype)
    target = target[:, :, 1:] if shift_target else target[:, :, :vocab]
    q = torch.rand(batch, n, vocab + 1, dtype=dtype)
    q = (q[:, :, 1:] if shift_draft else q[:, :, :vocab]) if draft else None
    draft_ids, accepted = torch.zeros(batch, n, dtype=ids), torch.zeros(batch, dtype=acc)
    if wide:  # strides past 32 bits, on dimensions of one element (so no memory behind them)
        draft_ids = draft_ids.as_strided((1, n), (2**31, 1))
        accepted = accepted.as_strided((1,), (2**31,))
    specops.chain_speculative_sampling(
        q, draft_ids, target, accepted, torch.zeros(batch, dtype=emit), seed=1,
        verification=verification)


verification = sys.argv[1]
for changes in ({}, dict(dtype=torch.float16), dict(dtype=torch.bfloat16), dict(ids=torch.int32),
                dict(acc=torch.int64), dict(emit=torch.int64), dict(draft=False), dict(n=7),
                dict(vocab=V - 1), dict(shift_target=True), dict(shift_draft=True),
                dict(batch=1), dict(batch=1, wide=True)):
    variant(verification=verification, **changes)


def logits_variant(dtype=torch.float32, source="probs", draft_dtype=torch.float32,
                   temperature=torch.float32, top_k=torch.int64, top_p=torch.float32,
                   min_p=torch.float32, n=N, vocab=V, shift_target=False, row_stride=0,
                   wide=False, verification="token"):
    # Rows of vocab + row_stride elements (16-byte multiples or not), the first one shifted or not.
    target = torch.randn(2, n + 1, vocab + 1 + row_stride, dtype=dtype)
    target = target[:, :, 1:vocab + 1] if shift_target else target[:, :, :vocab]
    draft = torch.rand(2, n, vocab, dtype=draft_dtype if source == "probs" else dtype)
    per_request = lambda value, dt: torch.tensor([value, value], dtype=dt)
    temperatures = per_request(0.7, temperature)
    if wide:  # a stride past 32 bits: about 8 GB of address space, two elements of it written
        temperatures = torch.empty(2**31 + 1, dtype=temperature).as_strided((2,), (2**31,))
        temperatures.fill_(0.7)
    specops.chain_speculative_sampling_from_logits(
        draft if source == "probs" else None, torch.zeros(2, n, dtype=torch.int64), target,
        temperature=temperatures, top_k=per_request(5, top_k),
        top_p=per_request(0.9, top_p), min_p=per_request(0.01, min_p),
        draft_logits=draft if source == "logits" else None, seed=1, verification=verification)


for changes in ({}, dict(dtype=torch.bfloat16), dict(dtype=torch.float16),
                dict(source="logits"), dict(source=None), dict(draft_dtype=torch.bfloat16),
                dict(temperature=torch.float64), dict(top_k=torch.int32),
                dict(top_p=torch.float64), dict(min_p=torch.float64), dict(n=7),
                dict(vocab=V - 1), dict(shift_target=True), dict(row_stride=1),
                dict(wide=True)):
    logits_variant(verification=verification, **changes)


def tree_variant(dtype=torch.float32, ids=torch.int64, parents=torch.int64, draft=True, m=N,
                 vocab=V, shift_target=False, shift_draft=False, batch=2, wide=False):
    target = torch.rand(batch, m + 1, vocab + 1, dtype=dtype)
    target = target[:, :, 1:] if shift_target else target[:, :, :vocab]
    q = torch.rand(batch, m + 1, vocab + 1, dtype=dtype)
    q = (q[:, :, 1:] if shift_draft else q[:, :, :vocab]) if draft else None
    draft_ids = torch.zeros(batch, m, dtype=ids)
    if wide:  # a stride past 32 bits, on a dimension of one element
        draft_ids = draft_ids.as_strided((1, m), (2**31, 1))
    specops.tree_speculative_sampling(q, draft_ids, torch.zeros(batch, m, dtype=parents), target,
                                      seed=1)


if verification == "token":  # the tree's kernel, in the half with fewer kernels
    for changes in ({}, dict(dtype=torch.float16), dict(dtype=torch.bfloat16),
                    dict(ids=torch.int32), dict(parents=torch.int32), dict(draft=False),
                    dict(m=20), dict(vocab=V - 1), dict(shift_target=True),
                    dict(shift_draft=True), dict(batch=1), dict(batch=1, wide=True)):
        tree_variant(**changes)
# The kernel every launch used against the one Triton's own binder picks for its arguments.
same = [compiled.kernel.hash == kernel.fn.warmup(*args, *constexprs, grid=(1,),
                                                 **kernel.options).hash
        for kernel, compiled, args, constexprs in launched]
print(json.dumps(dict(launches=len(launched), same=same)))
'''


def test_every_launch_uses_the_kernel_tritons_binder_picks():
    """The launchers' cache keys name every argument property Triton specialises on: a field
    dropped from a key makes a later variant reuse the kernel compiled for an earlier one."""
    # The two halves compile side by side (compiling is most of the test's time).
    with concurrent.futures.ThreadPoolExecutor(2) as pool:
        token, block = pool.map(lambda part: run_standin(KEY_SCRIPT, part), ("token", "block"))
    # Token: one launch; block: two; from logits one more (the statistics); tree: one.
    assert token["launches"] >= 13 + 2 * 15 + 12, token
    assert block["launches"] >= 2 * 13 + 3 * 15, block
    assert all(token["same"]) and all(block["same"]), (token, block)


OBSERVED_SCRIPT = r'''
import json, torch, triton, specops
from specops.chain.token import launch

B, N, V = 4, 3, 4096
args = (torch.rand(B, N, V), torch.zeros(B, N, dtype=torch.long), torch.rand(B, N + 1, V))
specops.chain_speculative_sampling(*args, seed=1)  # warm: later calls launch compiled kernels
report = {}

seen = []
launch.MAIN.fn.add_pre_run_hook(lambda *a, **k: seen.append(1))
specops.chain_speculative_sampling(*args, seed=2)
report["pre_run_hook_calls"] = len(seen)
launch.MAIN.fn.pre_run_hooks.clear()

loaded = driver.utils.modules_loaded
if hasattr(triton, "knobs"):
    triton.knobs.runtime.debug = True
    specops.chain_speculative_sampling(*args, seed=3)
    triton.knobs.runtime.debug = False
    report["debug_loaded"] = driver.utils.modules_loaded - loaded

    # Calls through kernel[grid] (JITFunction.run), while each setting is on, then with none.
    runtime, compilation = triton.knobs.runtime, triton.knobs.compilation
    grid_calls = []
    real_run = launch.MAIN.fn.run
    launch.MAIN.fn.run = lambda *a, **k: grid_calls.append(1) or real_run(*a, **k)

    def grid_calls_while(turn_on, turn_off):
        before = len(grid_calls)
        turn_on()
        specops.chain_speculative_sampling(*args, seed=4)
        turn_off()
        return len(grid_calls) - before

    exits = []
    exit_hook = lambda metadata: exits.append(1)
    if hasattr(runtime.launch_exit_hook, "add"):  # a chain of hooks
        report["exit_hook"] = grid_calls_while(lambda: runtime.launch_exit_hook.add(exit_hook),
                                               lambda: runtime.launch_exit_hook.remove(exit_hook))
    else:
        report["exit_hook"] = grid_calls_while(
            lambda: setattr(runtime, "launch_exit_hook", exit_hook),
            lambda: setattr(runtime, "launch_exit_hook", None))
    report["exit_hook_calls"] = len(exits)
    if hasattr(compilation, "fpsan_homomorphic_casts"):
        report["fpsan"] = grid_calls_while(
            lambda: setattr(compilation, "fpsan_homomorphic_casts", True),
            lambda: setattr(compilation, "fpsan_homomorphic_casts", False))
    report["nothing_set"] = grid_calls_while(lambda: None, lambda: None)
    # Settings whose kernel[grid] path needs a GPU here: the launcher's question alone.
    from specops.core.launcher import observed
    if hasattr(compilation, "instrumentation_mode"):
        compilation.instrumentation_mode = "consan"
        report["instrumentation_observed"] = observed()
        compilation.instrumentation_mode = ""
    if hasattr(runtime, "add_stages_inspection_hook"):
        runtime.add_stages_inspection_hook = lambda *a, **k: None
        report["stages_hook_observed"] = observed()
        runtime.add_stages_inspection_hook = None
    report["observed_after"] = observed()
print(json.dumps(report))
'''


def test_per_call_hooks_and_knobs_take_kernel_grid():
    # Set after warm-up, a pre-run hook sees the launch, TRITON_DEBUG's knob compiles (and
    # launches) debug kernels, as kernel[grid] does, and an exit hook or a sanitizer knob sends the
    # launch through kernel[grid]; launch enter hooks: test_nothing_compiles_after_warm_up's
    # "hooked" runs.
    report = run_standin(OBSERVED_SCRIPT)
    assert report["pre_run_hook_calls"] == 1, report
    if "debug_loaded" in report:
        assert report["debug_loaded"] >= 1, report
        assert report["exit_hook"] == 1 and report["exit_hook_calls"] == 1, report
        assert report.get("fpsan", 1) == 1 and report["nothing_set"] == 0, report
        assert report.get("instrumentation_observed", True), report
        assert report.get("stages_hook_observed", True) and not report["observed_after"], report


def test_host_overhead_benchmark_runs():
    # The checkout on PYTHONPATH: a script's own folder, not the checkout, heads its sys.path.
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    env["PYTHONPATH"] = os.pathsep.join(p for p in (ROOT, env.get("PYTHONPATH")) if p)
    proc = subprocess.run([sys.executable, "benchmarks/host_overhead.py", "--rounds", "1",
                           "--calls", "2"], capture_output=True, text=True, cwd=ROOT, env=env,
                          timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    for entry in ("bare launch (unit)", "public, torch.compile (inductor)", "public, seed tensor",
                  "public, seed int", "public, seed None", "registered op",
                  "modules loaded after warm-up: 0"):
        assert entry in proc.stdout, proc.stdout
