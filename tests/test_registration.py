"""The one call path: every public function calls its registered op (core/ops/registry.py,
``register_op``), so the op's kernel, checks and version bumps serve every call, and a kernel a user
registers for a device (``torch.library.register_kernel`` or ``torch.library.impl``) serves that
device's calls of the public functions too.
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


def run_python(code_or_args, env_changes, timeout=600):
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    env.update(env_changes)
    args = ["-c", code_or_args] if isinstance(code_or_args, str) else code_or_args
    return subprocess.run([sys.executable, *args], capture_output=True, text=True, cwd=ROOT,
                          env=env, timeout=timeout)


def test_triton_backend_without_driver_says_what_to_set():
    code = ("import torch, specops\n"
            "p = torch.full((2, 3, 5), 0.2)\n"
            "specops.chain_speculative_sampling(None, torch.zeros(2, 2, dtype=torch.long), p, seed=1)\n")
    result = run_python(code, {"SPECOPS_BACKEND": "triton"})
    assert result.returncode != 0
    last = result.stderr.strip().splitlines()[-1]
    assert "TRITON_INTERPRET=1" in last and "SPECOPS_BACKEND" in last, result.stderr[-2000:]


# ----------------------------------------------------------------------------------------------
# The public functions call the registered op


def inputs(batch=6, num_draft=3, vocab=700, seed=0):
    return softmax_inputs(batch, num_draft, vocab, seed=seed)


def op_args(batch):
    return (torch.zeros(batch, dtype=torch.int32), torch.zeros(batch, dtype=torch.int64),
            torch.arange(batch) * 7, torch.tensor([3]))


class OpRecorder(TorchDispatchMode):
    def __init__(self):
        super().__init__()
        self.ops = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        self.ops.append(func)
        return func(*args, **(kwargs or {}))


@pytest.mark.parametrize("seed_form", ["tensor", "int", "none"])
def test_public_function_matches_registered_op(seed_form):
    q, d, p = inputs()
    batch = d.shape[0]
    seed = {"tensor": torch.arange(batch) - 3, "int": 2**64 - 5, "none": None}[seed_form]
    for draft in (q, None):
        torch.manual_seed(11)
        out, acc, emit = specops.chain_speculative_sampling(draft, d, p, seed=seed, offset=None)
        torch.manual_seed(11)
        recorder = OpRecorder()
        with recorder:  # the dispatch mode sees every op the public function calls
            out2, acc2, emit2 = specops.chain_speculative_sampling(draft, d, p, seed=seed)
        assert OP.default in recorder.ops
        assert torch.equal(out, out2) and torch.equal(acc, acc2) and torch.equal(emit, emit2)


def test_public_function_bumps_counter_versions_like_the_op():
    q, d, p = inputs()
    acc = torch.zeros(d.shape[0], dtype=torch.int32)
    emit = torch.zeros(d.shape[0], dtype=torch.int64)
    for call in (lambda: specops.chain_speculative_sampling(q, d, p, acc, emit, seed=1),
                 lambda: OP(q, d, p, acc, emit, torch.tensor([1]), torch.tensor([0]))):
        before = acc._version, emit._version
        call()
        # Autograd sees the counters change (custom_op bumps the versions of mutated arguments).
        assert acc._version > before[0] and emit._version > before[1]


def test_make_fx_and_vmap_see_the_registered_op():
    from torch.fx.experimental.proxy_tensor import make_fx

    q, d, p = inputs(batch=2, num_draft=2, vocab=50)
    graph = make_fx(lambda q, d, p: specops.chain_speculative_sampling(q, d, p, seed=3)[0])(q, d, p)
    assert any(node.target is OP.default for node in graph.graph.nodes)
    # No batching rule: under vmap the call reaches the op, which refuses it, rather than a
    # kernel that would read batched tensors as plain ones.
    with pytest.raises(RuntimeError, match="chain_speculative_sampling"):
        torch.vmap(lambda p: specops.chain_speculative_sampling(None, d[0:1], p[None], seed=1)[0])(p)


@pytest.mark.parametrize("context", ["plain", "no_grad", "inference_mode", "dispatch_mode",
                                     "requires_grad"])
def test_registered_op_same_tokens_in_every_context(context):
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


def test_triton_launchers_run_on_the_tensors_cuda_device(monkeypatch):
    # Triton launches on the current CUDA device: tensors on another one must be served with their
    # device made current (else the kernel reads another GPU's memory), and the current one restored.
    from specops.core.ops.registry import Backends

    current = [0]

    @contextlib.contextmanager
    def made_current(device):
        before, current[0] = current[0], torch.device(device).index
        try:
            yield
        finally:
            current[0] = before

    monkeypatch.setattr(torch.cuda, "current_device", lambda: current[0])
    monkeypatch.setattr(torch.cuda, "device", made_current)
    monkeypatch.setenv("SPECOPS_BACKEND", "triton")
    launched_on = []
    backends = Backends(reference=None, cpu=None,
                        triton=lambda: lambda *args, **options: launched_on.append(current[0]))
    for index in (1, 0, 2):
        backends.run(torch.device("cuda", index), "tensors")
    assert launched_on == [1, 0, 2] and current[0] == 0


def test_zero_tensor_input_reaches_its_own_key(monkeypatch):
    # An efficient zero tensor has no storage: it must be materialised below autograd, not handed
    # to the kernel (the interpreted Triton kernel reads its data pointer, as a GPU launch would).
    monkeypatch.setenv("SPECOPS_BACKEND", "triton")
    q, d, p = inputs(batch=3, num_draft=2, vocab=64)
    zeros = torch._efficientzerotensor(q.shape)
    out = OP(zeros, d, p, *op_args(3))
    assert torch.equal(out, OP(torch.zeros_like(q), d, p, *op_args(3)))


USER_KERNEL = r'''
import json, torch, specops
from inputs import softmax_inputs
q, d, p = softmax_inputs(3, 2, 64)
counters = lambda: (torch.zeros(3, dtype=torch.int32), torch.zeros(3, dtype=torch.int32))
calls = []


def mine(draft, ids, target, accepted, emitted, seed, offset, deterministic=True):
    calls.append(target.device.type)
    return torch.full((3, 3), 7, dtype=torch.int32)


before = specops.chain_speculative_sampling(q, d, p, *counters(), seed=1)[0]
torch.library.register_kernel("specops::chain_speculative_sampling", "cuda", mine)
cuda_only = specops.chain_speculative_sampling(q, d, p, *counters(), seed=1)[0]
torch.library.register_kernel("specops::chain_speculative_sampling", "cpu", mine)
op = torch.ops.specops.chain_speculative_sampling(q, d, p, *counters(), torch.tensor([1]),
                                                  torch.tensor([0]))
public = specops.chain_speculative_sampling(q, d, p, *counters(), seed=1)[0]
block = specops.chain_speculative_sampling(q, d, p, *counters(), seed=1, verification="block")[0]
print(json.dumps(dict(calls=calls, cuda_only_unchanged=torch.equal(cuda_only, before),
                      op=op.tolist(), public=public.tolist(), block_is_7=bool((block == 7).all()))))
'''


def test_a_users_kernel_is_honoured_by_the_op_and_the_public_function():
    # In a process of its own: a registration lasts as long as the process.
    result = run_python(USER_KERNEL, {"PYTHONPATH": str(ROOT / "tests")})
    assert result.returncode == 0, result.stderr[-3000:]
    report = json.loads(result.stdout.strip().splitlines()[-1])
    assert report["cuda_only_unchanged"]  # a kernel for another device changes nothing here
    assert report["calls"] == ["cpu", "cpu"]  # the op, then the public function
    assert report["op"] == report["public"] == [[7, 7, 7]] * 3
    assert not report["block_is_7"]  # another op keeps its own kernel


def _public_call(name):
    """A call of the public function that runs ``specops::<name>``, on 3 requests of 2 drafts."""
    q, d, p = inputs(batch=3, num_draft=2, vocab=64)
    if name == "chain_speculative_sampling":
        return lambda: specops.chain_speculative_sampling(q, d, p, seed=1)[0]
    if name == "chain_block_speculative_sampling":
        return lambda: specops.chain_speculative_sampling(q, d, p, seed=1,
                                                          verification="block")[0]
    if name == "chain_speculative_sampling_from_logits":
        return lambda: specops.chain_speculative_sampling_from_logits(None, d, p.log(), seed=1,
                                                                      top_k=5)[0]
    return lambda: specops.tree_speculative_sampling(None, d, torch.zeros_like(d), p, seed=1)[0]


def _sevens(*args):
    """A user's kernel: 7 everywhere, in the shapes of the op's outputs."""
    sevens = torch.full((3, 3), 7, dtype=torch.int32)
    if args[2].dim() == 2:  # the tree's op: (draft, ids, parents, ...)
        return sevens, sevens[:, :2].clone(), sevens[:, 0].clone()
    if len(args) > 8:  # an op from logits: the tokens and this call's counts
        return sevens, sevens[:, 0].clone(), sevens[:, 0].clone()
    return sevens


@pytest.mark.parametrize("name", ["chain_speculative_sampling", "chain_block_speculative_sampling",
                                  "chain_speculative_sampling_from_logits",
                                  "tree_speculative_sampling"])
def test_a_users_impl_for_a_device_serves_the_public_function(name):
    call = _public_call(name)
    before = call()
    assert not (before == 7).all()
    # The registration lasts as long as its Library: deleting it restores the op's own kernel.
    lib = torch.library.Library("specops", "FRAGMENT")
    try:
        torch.library.impl(f"specops::{name}", "cpu", _sevens, lib=lib)
        assert (call() == 7).all()
    finally:
        del lib
    assert torch.equal(call(), before)
