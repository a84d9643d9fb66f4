"""The GPU path on the host: Triton's real launch path driven by the stand-in driver
(benchmarks/standin_driver.py) on CPU tensors, the plain-eager shortcut of the public function,
and the errors a newcomer meets first.

The stand-in driver needs compiled kernels, so its checks run in a subprocess without
TRITON_INTERPRET (conftest.py sets it for this process).
"""

from __future__ import annotations

import contextlib
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode

import specops
from inputs import softmax_inputs  # tests/inputs.py

ROOT = Path(__file__).resolve().parents[1]
OP = torch.ops.specops.chain_speculative_sampling

# The start of every stand-in script: the driver installed before the first launch, B, N and V.
STANDIN_PREAMBLE = r'''
import json, sys
sys.path.insert(0, "benchmarks")  # standin_driver lives with the benchmarks
import standin_driver
driver = standin_driver.install()
import torch, triton, specops
B, N, V = 16, 4, 32000
'''

STANDIN_SCRIPT = STANDIN_PREAMBLE + r'''
OP = torch.ops.specops.chain_speculative_sampling
gen = torch.Generator().manual_seed(0)
target = torch.rand(B, N + 1, V, generator=gen)
draft = torch.rand(B, N, V, generator=gen)
ids = torch.randint(0, V, (B, N), generator=gen)
acc = torch.zeros(B, dtype=torch.int32)
emit = torch.zeros(B, dtype=torch.int32)
seeds = torch.arange(B)

def calls(k):
    specops.chain_speculative_sampling(draft, ids, target, acc, emit, seed=k)
    specops.chain_speculative_sampling(draft, ids, target, acc, emit, seed=torch.tensor([k]),
                                       offset=torch.tensor([k]))
    specops.chain_speculative_sampling(draft, ids, target, acc, emit)
    specops.chain_speculative_sampling(draft, ids, target, acc, emit, seed=seeds + k, offset=k)
    OP(draft, ids, target, acc, emit, torch.tensor([k]), torch.tensor([0]))

calls(0)  # warm-up: compiles and loads every specialisation these calls need
loaded, launched = driver.utils.modules_loaded, driver.utils.launches
for k in range(1, 6):
    calls(k)
print(json.dumps(dict(warmup_loaded=loaded, loaded_after=driver.utils.modules_loaded - loaded,
                      launches_after=driver.utils.launches - launched)))
'''


def run_python(code_or_args, env_changes, timeout=600):
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    env.update(env_changes)
    args = ["-c", code_or_args] if isinstance(code_or_args, str) else code_or_args
    return subprocess.run([sys.executable, *args], capture_output=True, text=True, cwd=ROOT,
                          env=env, timeout=timeout)


def test_standin_driver_nothing_loads_after_warmup():
    result = run_python(STANDIN_SCRIPT, {"SPECOPS_BACKEND": "triton"})
    assert result.returncode == 0, result.stderr[-3000:]
    counts = json.loads(result.stdout.strip().splitlines()[-1])
    assert counts["warmup_loaded"] >= 1
    assert counts["loaded_after"] == 0, counts  # new seeds and offsets: no new specialisation
    assert counts["launches_after"] >= 5 * 5, counts  # every call reached the (stand-in) launch


def test_host_overhead_benchmark_runs():
    result = run_python(["benchmarks/host_overhead.py", "--rounds", "1", "--calls", "2"], {})
    assert result.returncode == 0, result.stderr[-3000:]
    out = result.stdout
    for entry in ("bare launch (unit)", "public, seed tensor", "public, seed int",
                  "public, seed None", "registered op", "modules loaded after warm-up: 0"):
        assert entry in out, out


C_CALL_SCRIPT = STANDIN_PREAMBLE + r'''
from specops.chain import launch
from specops.core import triton_launch
specops.chain_speculative_sampling(torch.rand(B, N, V), torch.zeros(B, N, dtype=torch.long),
                                   torch.rand(B, N + 1, V), seed=1)
if not triton_launch.direct_launch_supported():
    print(json.dumps(dict(direct_launch_supported=False)))
    sys.exit(0)
loaded = next(iter(launch._LOADED.values()))
results = []
for kernel in (loaded.main, loaded.combine):
    calls = []
    record = lambda *args: calls.append(
        tuple(id(a) if torch.is_tensor(a) else repr(a) for a in args))
    kernel._run.launch = record  # the C function, as the wrapper and the direct path find it
    if hasattr(kernel, "_c_launch"):
        kernel._c_launch = record
    args = (torch.zeros(3), 7, True, torch.ones(2))
    kernel.launch(5, 3, 11, args)
    kernel._launch_through_wrapper(5, 3, 11, args)
    results.append(dict(direct=kernel.launch != kernel._launch_through_wrapper,
                        known=triton_launch.calls_c_function_directly(type(kernel._run)),
                        same=calls[0] == calls[1]))
version = tuple(int(part) for part in triton.__version__.split(".")[:2])
known_release = (3, 7) <= version <= (3, 9)
print(json.dumps(dict(expect_known=standin_driver.PYTHON_LAUNCHER and known_release,
                      kernels=results)))
'''


def test_direct_c_launch_passes_what_the_wrapper_passes():
    # Where the installed Triton's launcher wrapper is a known one, loaded kernels call its C
    # function themselves: with exactly the arguments the wrapper would have given it.
    result = run_python(C_CALL_SCRIPT, {"SPECOPS_BACKEND": "triton"})
    assert result.returncode == 0, result.stderr[-3000:]
    report = json.loads(result.stdout.strip().splitlines()[-1])
    if report.get("direct_launch_supported") is False:
        pytest.skip("this Triton release's JITFunction.run is not one the direct launch knows")
    for kernel in report["kernels"]:
        assert kernel["same"], report
        assert kernel["direct"] == kernel["known"], report  # neither kernel needs scratch
        # Triton's own wrapper, in a release whose call this project knows (3.7 to 3.9).
        assert kernel["known"] or not report["expect_known"], report


HOOK_SCRIPT = STANDIN_PREAMBLE + r'''
args = (torch.rand(B, N, V), torch.zeros(B, N, dtype=torch.long), torch.rand(B, N + 1, V))
specops.chain_speculative_sampling(*args, seed=1)  # warm: later calls launch directly
seen = []
hook = lambda metadata: seen.append(1)
if not hasattr(triton, "knobs"):  # releases before 3.4 keep the hook on CompiledKernel
    triton.compiler.CompiledKernel.launch_enter_hook = hook
elif hasattr(triton.knobs.runtime.launch_enter_hook, "add"):  # a chain of hooks
    triton.knobs.runtime.launch_enter_hook.add(hook)
else:
    triton.knobs.runtime.launch_enter_hook = hook
specops.chain_speculative_sampling(*args, seed=2)
print(json.dumps(dict(hook_calls=len(seen))))
'''


def test_launch_hooks_see_every_launch():
    # A profiler's launch hooks are called by kernel[grid], not by a direct launch: while one is
    # set, warm calls take kernel[grid] (two launches here: the main and combine kernels).
    result = run_python(HOOK_SCRIPT, {"SPECOPS_BACKEND": "triton"})
    assert result.returncode == 0, result.stderr[-3000:]
    assert json.loads(result.stdout.strip().splitlines()[-1]) == {"hook_calls": 2}


def test_triton_backend_without_driver_says_what_to_set():
    code = ("import torch, specops\n"
            "p = torch.full((2, 3, 5), 0.2)\n"
            "specops.chain_speculative_sampling(None, torch.zeros(2, 2, dtype=torch.long), p, seed=1)\n")
    result = run_python(code, {"SPECOPS_BACKEND": "triton"})
    assert result.returncode != 0
    last = result.stderr.strip().splitlines()[-1]
    assert "TRITON_INTERPRET=1" in last and "SPECOPS_BACKEND" in last, result.stderr[-2000:]


# ----------------------------------------------------------------------------------------------
# The plain-eager shortcut: same results; the registered op whenever something may record


def inputs(batch=6, num_draft=3, vocab=700, seed=0):
    return softmax_inputs(batch, num_draft, vocab, seed=seed)


class OpRecorder(TorchDispatchMode):
    def __init__(self):
        super().__init__()
        self.ops = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        self.ops.append(func)
        return func(*args, **(kwargs or {}))


@pytest.mark.parametrize("seed_form", ["tensor", "int", "none"])
def test_shortcut_matches_registered_op(seed_form):
    q, d, p = inputs()
    batch = d.shape[0]
    seed = {"tensor": torch.arange(batch) - 3, "int": 2**64 - 5, "none": None}[seed_form]
    for draft in (q, None):
        torch.manual_seed(11)
        out, acc, emit = specops.chain_speculative_sampling(draft, d, p, seed=seed, offset=None)
        torch.manual_seed(11)
        recorder = OpRecorder()
        with recorder:  # a dispatch mode is active: the public function takes the registered op
            out2, acc2, emit2 = specops.chain_speculative_sampling(draft, d, p, seed=seed)
        assert OP.default in recorder.ops
        assert torch.equal(out, out2) and torch.equal(acc, acc2) and torch.equal(emit, emit2)


def test_shortcut_bumps_counter_versions_like_the_op():
    q, d, p = inputs()
    acc = torch.zeros(d.shape[0], dtype=torch.int32)
    emit = torch.zeros(d.shape[0], dtype=torch.int64)
    for call in (lambda: specops.chain_speculative_sampling(q, d, p, acc, emit, seed=1),
                 lambda: OP(q, d, p, acc, emit, torch.tensor([1]), torch.tensor([0]))):
        before = acc._version, emit._version
        call()
        # Autograd sees the counters change, through the shortcut as through the op.
        assert acc._version > before[0] and emit._version > before[1]


def test_int_seed_constants_are_shared_and_never_written():
    q, d, p = inputs()
    from specops.core.seeding import resolve_seed_and_offset

    s1, o1 = resolve_seed_and_offset(77, None, None, p.device, cache=True)
    s2, o2 = resolve_seed_and_offset(77, None, None, p.device, cache=True)
    assert s1 is s2 and o1 is o2 and s1.tolist() == [77] and o1.tolist() == [0]
    specops.chain_speculative_sampling(q, d, p, seed=77)
    assert s1.tolist() == [77] and o1.tolist() == [0]
    # A traced call builds its own (the graph holds them as constants).
    s3, _ = resolve_seed_and_offset(77, None, None, p.device, cache=False)
    assert s3 is not s1


def test_make_fx_and_vmap_see_the_registered_op():
    from torch.fx.experimental.proxy_tensor import make_fx

    q, d, p = inputs(batch=2, num_draft=2, vocab=50)
    graph = make_fx(lambda q, d, p: specops.chain_speculative_sampling(q, d, p, seed=3)[0])(q, d, p)
    assert any(node.target is OP.default for node in graph.graph.nodes)
    # No batching rule: under vmap the call reaches the op, which refuses it, rather than a
    # kernel that would read batched tensors as plain ones.
    with pytest.raises(RuntimeError, match="chain_speculative_sampling"):
        torch.vmap(lambda p: specops.chain_speculative_sampling(None, d[0:1], p[None], seed=1)[0])(p)


# ----------------------------------------------------------------------------------------------
# The registered op's own eager path: custom_op's Python wrappers skipped, nothing else changed

CUSTOM_OP_WRAPPERS = {"autograd_impl", "adinplaceorview_impl", "backend_impl", "fill_defaults"}


def python_functions_called(fn):
    called = set()

    def profile(frame, event, arg):
        if event == "call":
            called.add(frame.f_code.co_name)

    sys.setprofile(profile)
    try:
        fn()
    finally:
        sys.setprofile(None)
    return called


def op_args(batch):
    return (torch.zeros(batch, dtype=torch.int32), torch.zeros(batch, dtype=torch.int64),
            torch.arange(batch) * 7, torch.tensor([3]))


def test_registered_op_skips_custom_op_wrappers_in_plain_eager_calls():
    q, d, p = inputs()
    acc, emit, seed, offset = op_args(d.shape[0])
    called = python_functions_called(lambda: OP(q, d, p, acc, emit, seed, offset))
    assert "run" in called  # the op's eager entry ran
    assert not called & CUSTOM_OP_WRAPPERS, called & CUSTOM_OP_WRAPPERS
    # Recorded calls still go through custom_op's machinery (its version bump, the fake, modes).
    with OpRecorder() as recorder:
        called = python_functions_called(lambda: OP(q, d, p, acc, emit, seed, offset))
    assert OP.default in recorder.ops and "adinplaceorview_impl" in called


@pytest.mark.parametrize("context", ["plain", "no_grad", "inference_mode", "dispatch_mode",
                                     "requires_grad"])
def test_registered_op_same_tokens_on_every_path(context):
    q, d, p = inputs()
    batch = d.shape[0]
    expected = specops.chain_speculative_sampling(q, d, p, seed=torch.arange(batch) * 7,
                                                  offset=3)
    if context == "requires_grad":
        q, p = q.clone().requires_grad_(), p.clone().requires_grad_()
    manager = {"no_grad": torch.no_grad, "inference_mode": torch.inference_mode,
               "dispatch_mode": OpRecorder}.get(context)
    with manager() if manager else contextlib.nullcontext():
        acc, emit, seed, offset = op_args(batch)
        out = OP(q, d, p, acc, emit, seed, offset)
    assert torch.equal(out, expected[0])
    assert torch.equal(acc, expected[1]) and torch.equal(emit.to(torch.int32), expected[2])
    assert not out.requires_grad


@pytest.mark.parametrize("transform", ["grad", "jvp", "vjp"])
@pytest.mark.parametrize("public", [False, True])
def test_same_tokens_inside_functorch_transforms(transform, public):
    # grad, jvp and vjp put their own key below autograd: a call inside them (closing over its
    # inputs) must reach it, not the kernel.
    q, d, p = inputs()
    batch = d.shape[0]
    expected = specops.chain_speculative_sampling(q, d, p, seed=torch.arange(batch) * 7,
                                                  offset=3)

    def step(x):
        acc, emit, seed, offset = op_args(batch)
        if public:
            out = specops.chain_speculative_sampling(q, d, p, acc, emit, seed=seed,
                                                     offset=offset)[0]
        else:
            out = OP(q, d, p, acc, emit, seed, offset)
        return (x * 2).sum(), (out, acc, emit)

    x = torch.ones(3)
    if transform == "grad":
        out, acc, emit = torch.func.grad(step, has_aux=True)(x)[1]
    elif transform == "jvp":
        out, acc, emit = torch.func.jvp(step, (x,), (x,), has_aux=True)[2]
    else:
        out, acc, emit = torch.func.vjp(step, x, has_aux=True)[2]
    assert torch.equal(out, expected[0])
    assert torch.equal(acc, expected[1]) and torch.equal(emit.to(torch.int32), expected[2])


def test_opcheck_with_inputs_that_require_grad():
    # opcheck's autograd-registration test needs an input that requires grad.
    q, d, p = inputs(batch=3, num_draft=2, vocab=64)
    acc, emit, seed, offset = op_args(3)
    torch.library.opcheck(OP, (q.requires_grad_(), d, p.requires_grad_(), acc, emit, seed,
                               offset, True))


def test_eager_op_inside_a_compiled_region_is_not_traced_into():
    # A call Dynamo leaves eager (here: a function it must not compile) still runs inside a
    # compiled region: the op's kernels must not be compiled as new frames of their own.
    import functools

    from torch._dynamo.utils import counters

    q, d, p = inputs(batch=3, num_draft=2, vocab=64)
    acc, emit, seed, offset = op_args(3)

    @functools.partial(torch.compiler.disable, recursive=False)
    def call_op(*args):
        return OP(*args)

    @torch.compile(backend="eager")
    def step(*args):
        return call_op(*args) + 0

    torch._dynamo.reset()
    counters.clear()
    out = step(q, d, p, acc, emit, seed, offset)
    assert counters["stats"]["unique_graphs"] == 1, dict(counters["stats"])
    assert torch.equal(out, OP(q, d, p, *op_args(3)))


def test_zero_tensor_input_reaches_its_own_key(monkeypatch):
    # An efficient zero tensor has no storage: it must be materialised below autograd, not handed
    # to the kernel (the interpreted Triton kernel reads its data pointer, as a GPU launch would).
    monkeypatch.setenv("SPECOPS_BACKEND", "triton")
    q, d, p = inputs(batch=3, num_draft=2, vocab=64)
    zeros = torch._efficientzerotensor(q.shape)
    out = OP(zeros, d, p, *op_args(3))
    assert torch.equal(out, OP(torch.zeros_like(q), d, p, *op_args(3)))


def test_inputs_that_require_grad_record_no_autograd_graph():
    from specops.block import op as block_op

    q, d, p = inputs(batch=3, num_draft=2, vocab=64)
    q, p = q.clone().requires_grad_(), p.clone().requires_grad_()
    saved = []
    with torch.autograd.graph.saved_tensors_hooks(lambda t: saved.append(t) or t, lambda t: t):
        OP(q, d, p, *op_args(3))
        block_op.chain_block_speculative_sampling_op.op(q, d, p, *op_args(3))
    assert saved == []


def test_shortcuts_are_registered_for_cpu_and_cuda():
    for name in ("specops::chain_speculative_sampling",
                 "specops::chain_block_speculative_sampling"):
        for key in ("CPU", "CUDA", "AutogradCPU", "AutogradCUDA"):
            assert torch._C._dispatch_has_kernel_for_dispatch_key(name, key), (name, key)
