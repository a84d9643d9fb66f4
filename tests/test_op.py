"""The registered op and the FlashInfer-compatible wrapper: registration (opcheck, schema),
fixed-seed outputs, torch.compile, in-place counters, generators, seeds and batch invariance."""

from __future__ import annotations

import inspect

import expecttest

import pytest
import torch

import specops
from specops.core.sampling.randomness import request_uniforms

from inputs import counters, softmax_inputs as make_inputs  # tests/inputs.py

OP = torch.ops.specops.chain_speculative_sampling


def portable_inputs(batch, num_draft, vocab, seed):
    """Inputs that are the same under every torch version: drawn from specops' own Philox (torch's
    generators may change between releases), with exact float32 arithmetic only (no exp, no
    normalising sum: the op uses rows as given)."""
    count = batch * (2 * num_draft + 1) * vocab + batch * num_draft
    u = request_uniforms(torch.tensor([seed]), torch.tensor([0]), 1, count).reshape(-1)
    rows, ids = u[: count - batch * num_draft], u[count - batch * num_draft :]
    p = (rows[: batch * (num_draft + 1) * vocab] ** 4).reshape(batch, num_draft + 1, vocab)
    q = (rows[batch * (num_draft + 1) * vocab :] ** 4).reshape(batch, num_draft, vocab)
    d = (ids * vocab).long().reshape(batch, num_draft)
    return q, d, p


# ----------------------------------------------------------------------------------------------
# Registration


OPCHECK_CONFIGS = [
    # (with_draft, prob dtype, id dtype, counter dtype, per-request seeds)
    (True, torch.float32, torch.int64, torch.int32, False),
    (False, torch.float32, torch.int32, torch.int64, False),
    (True, torch.float16, torch.int32, torch.int32, True),
    (True, torch.bfloat16, torch.int64, torch.int64, True),
    (False, torch.bfloat16, torch.int64, torch.int32, True),
    (False, torch.float16, torch.int64, torch.int64, False),
]


@pytest.mark.parametrize("with_draft,dtype,id_dtype,counter_dtype,per_request", OPCHECK_CONFIGS)
def test_opcheck(with_draft, dtype, id_dtype, counter_dtype, per_request):
    batch = 5
    q, d, p = make_inputs(batch, 3, 40, dtype, id_dtype, with_draft)
    d[1, 1] = -1  # padding and out-of-range ids exercise the early-end path
    d[2, 0] = 40
    acc, emit = counters(batch, counter_dtype)
    seed = torch.arange(batch) * 1000 - 3 if per_request else torch.tensor([17])
    offset = torch.arange(batch) if per_request else torch.tensor([2])
    torch.library.opcheck(OP, (q, d, p, acc, emit, seed, offset, True))


def test_opcheck_empty_batch():
    q, d, p = make_inputs(0, 2, 8)
    acc, emit = counters(0)
    torch.library.opcheck(OP, (q, d, p, acc, emit, torch.tensor([1]), torch.tensor([0]), True))


@pytest.mark.parametrize("op", [OP, torch.ops.specops.chain_block_speculative_sampling])
def test_opcheck_no_drafts(op):
    """N = 0: a (B, 1) output from the single row; the fake agrees on shape and dtype."""
    q, d, p = make_inputs(3, 0, 40)
    acc, emit = counters(3)
    torch.library.opcheck(op, (q, d, p, acc, emit, torch.tensor([1]), torch.tensor([0]), True))
    torch.library.opcheck(op, (None, d, p, acc, emit, torch.tensor([1, 2, 3]), torch.tensor([0]),
                               True))


class TestExpected(expecttest.TestCase):
    def test_schema(self):
        self.assertExpectedInline(
            str(OP.default._schema),
            """specops::chain_speculative_sampling(Tensor? draft_probs, Tensor draft_token_ids, Tensor target_probs, Tensor(a!) accepted_num, Tensor(b!) emitted_num, Tensor seed, Tensor offset, bool deterministic=True) -> Tensor""",
        )

    def test_fixed_seed_output(self):
        # Pinned tokens: any change to the RNG layout or the sampling algorithm changes these,
        # and must then be a deliberate, documented change (the Triton kernel matches them).
        q, d, p = portable_inputs(batch=4, num_draft=3, vocab=3000, seed=7)
        d[3, 1] = -1
        acc, emit = counters(4, torch.int64)
        out = OP(q, d, p, acc, emit, torch.tensor([2024]), torch.tensor([5]))
        self.assertExpectedInline(
            f"drafts={d.tolist()}\noutput={out.tolist()}\naccepted={acc.tolist()}\nemitted={emit.tolist()}",
            """\
drafts=[[2423, 693, 2465], [2756, 1850, 1677], [1241, 2126, 2828], [1487, -1, 2799]]
output=[[2423, 1367, -1, -1], [2756, 165, -1, -1], [2720, -1, -1, -1], [1487, 1319, -1, -1]]
accepted=[1, 2, 1, 2]
emitted=[1, 1, 0, 1]""",
        )
        # Block verification of the same inputs: its stop coins sit between the coins.
        acc_b, emit_b = counters(4, torch.int64)
        out_b = torch.ops.specops.chain_block_speculative_sampling(
            q, d, p, acc_b, emit_b, torch.tensor([2024]), torch.tensor([5]))
        self.assertExpectedInline(
            f"output={out_b.tolist()}\naccepted={acc_b.tolist()}\nemitted={emit_b.tolist()}",
            """\
output=[[2423, 693, 2465, 1332], [2756, 1850, 1677, 149], [1241, 2126, 2828, 2700], [1487, 1319, -1, -1]]
accepted=[1, 2, 1, 2]
emitted=[3, 3, 3, 1]""",
        )
        # One-hot drafts; rows 0-1 give their drafts p = 0.6 (accepted 60% of the time).
        p2 = p.clone()
        p2[:2, :3].scatter_(2, d[:2, :, None], 0.6)
        out2, acc2, emit2 = specops.chain_speculative_sampling(None, d, p2, seed=-5, offset=1)
        self.assertExpectedInline(
            f"output={out2.tolist()}\naccepted={acc2.tolist()}\nemitted={emit2.tolist()}",
            """\
output=[[907, -1, -1, -1], [1955, -1, -1, -1], [2711, -1, -1, -1], [1487, 2660, -1, -1]]
accepted=[2, 2, 0, 1]
emitted=[0, 0, 0, 1]""",
        )


# ----------------------------------------------------------------------------------------------
# FlashInfer's docstring example: position 0 has p >= q (always accepted), position 1 has p = 0
# at the draft (always rejected) and the residual relu(p - q) is all at token 0.


def flashinfer_example(dtype=torch.float32, batch=1):
    draft_probs = torch.tensor([[[0.1, 0.2, 0.3, 0.4], [0.2, 0.3, 0.4, 0.1]]], dtype=dtype)
    draft_token_ids = torch.tensor([[2, 1]], dtype=torch.int32)
    target_probs = torch.tensor(
        [[[0.0, 0.1, 0.6, 0.3], [1.0, 0.0, 0.0, 0.0], [0.7, 0.1, 0.1, 0.1]]], dtype=dtype
    )
    return (draft_probs.expand(batch, -1, -1), draft_token_ids.expand(batch, -1),
            target_probs.expand(batch, -1, -1))


def test_flashinfer_example_every_seed():
    q, d, p = flashinfer_example()
    for seed in list(range(200)) + [-1, 2**63 - 1, -(2**63)]:
        out, acc, emit = specops.chain_speculative_sampling(q, d, p, seed=seed, offset=seed % 7)
        assert out.tolist() == [[2, 0, -1]], seed
        assert acc.tolist() == [1] and emit.tolist() == [1], seed
        assert out.dtype == torch.int32


def test_flashinfer_example_generator_and_batched_seeds():
    # No seed: the default generator, as in the docstring (torch.manual_seed(42)).
    torch.manual_seed(42)
    for _ in range(20):
        out, acc, emit = specops.chain_speculative_sampling(*flashinfer_example())
        assert out.tolist() == [[2, 0, -1]] and acc.tolist() == [1] and emit.tolist() == [1]
    # 1000 copies with 1000 per-request seeds, in every probability dtype (values exact in each).
    batch = 1000
    for dtype in (torch.float32, torch.float16, torch.bfloat16):
        q, d, p = flashinfer_example(dtype, batch)
        out, acc, emit = specops.chain_speculative_sampling(
            q, d, p, seed=torch.arange(batch) * 7919 - 500, offset=torch.arange(batch)
        )
        assert (out == torch.tensor([2, 0, -1], dtype=torch.int32)).all()
        assert (acc == 1).all() and (emit == 1).all()


# ----------------------------------------------------------------------------------------------
# torch.compile(fullgraph=True) matches eager


def _op_fn(q, d, p, acc, emit, seed, offset):
    return OP(q, d, p, acc, emit, seed, offset)


def _wrapper_fn(q, d, p, acc, emit):
    return specops.chain_speculative_sampling(q, d, p, acc, emit, seed=1234, offset=9)


@pytest.mark.parametrize("backend", ["aot_eager", "inductor"])
@pytest.mark.parametrize("with_draft", [True, False])
def test_compile_matches_eager(backend, with_draft):
    torch._dynamo.reset()
    batch = 6
    q, d, p = make_inputs(batch, 3, 1500, with_draft=with_draft, seed=3)
    d[0, 1] = -1
    seeds = torch.tensor([3, -4, 5, 6, 7, 8])
    offsets = torch.tensor([11])

    acc_e, emit_e = counters(batch, torch.int64)
    out_e = _op_fn(q, d, p, acc_e, emit_e, seeds, offsets)
    acc_c, emit_c = counters(batch, torch.int64)
    compiled = torch.compile(_op_fn, fullgraph=True, backend=backend)
    out_c = compiled(q, d, p, acc_c, emit_c, seeds, offsets)
    assert torch.equal(out_c, out_e)
    assert torch.equal(acc_c, acc_e) and torch.equal(emit_c, emit_e)
    # Counters keep accumulating in place through the compiled graph.
    out_c2 = compiled(q, d, p, acc_c, emit_c, seeds, offsets)
    assert torch.equal(out_c2, out_e)
    assert torch.equal(acc_c, 2 * acc_e) and torch.equal(emit_c, 2 * emit_e)

    # The wrapper, with the seed given (int seed and offset become constants of the graph).
    acc_w, emit_w = counters(batch, torch.int32)
    out_w, a_w, e_w = _wrapper_fn(q, d, p, acc_w, emit_w)
    acc_wc, emit_wc = counters(batch, torch.int32)
    out_wc, a_wc, e_wc = torch.compile(_wrapper_fn, fullgraph=True, backend=backend)(
        q, d, p, acc_wc, emit_wc
    )
    assert torch.equal(out_wc, out_w)
    assert torch.equal(a_wc, a_w) and torch.equal(e_wc, e_w)
    assert a_wc is acc_wc and e_wc is emit_wc
    assert torch.equal(acc_wc, acc_w) and torch.equal(emit_wc, emit_w)


# ----------------------------------------------------------------------------------------------
# Counters


@pytest.mark.parametrize("counter_dtype", [torch.int32, torch.int64])
def test_counters_accumulate_in_place(counter_dtype):
    batch = 8
    q, d, p = make_inputs(batch, 4, 30, seed=1)
    acc = torch.full((batch,), 100, dtype=counter_dtype)
    emit = torch.full((batch,), -3, dtype=counter_dtype)
    acc_ptr, emit_ptr = acc.data_ptr(), emit.data_ptr()
    total_acc = torch.zeros(batch, dtype=torch.int64)
    total_emit = torch.zeros(batch, dtype=torch.int64)
    for call in range(5):
        out, a, e = specops.chain_speculative_sampling(q, d, p, acc, emit, seed=call)
        assert a is acc and e is emit  # the given tensor objects are returned
        assert a.dtype == counter_dtype and e.dtype == counter_dtype
        _, a1, e1 = specops.chain_speculative_sampling(q, d, p, seed=call)  # fresh counters
        assert a1.dtype == torch.int32 and e1.dtype == torch.int32
        total_acc += a1
        total_emit += e1
        # emitted = number of output tokens before the first -1, minus the sampled one.
        assert torch.equal(e1.long(), (out >= 0).sum(1) - 1)
    assert acc.data_ptr() == acc_ptr and emit.data_ptr() == emit_ptr
    assert torch.equal(acc.long(), 100 + total_acc)
    assert torch.equal(emit.long(), -3 + total_emit)
    assert int(total_acc.sum()) > 0


def test_counters_large_int64_values():
    # int64 counters really are int64: values beyond int32 keep their high bits.
    q, d, p = make_inputs(2, 2, 10, seed=2)
    big = 2**40
    acc = torch.full((2,), big, dtype=torch.int64)
    emit = torch.full((2,), big, dtype=torch.int64)
    _, a, e = specops.chain_speculative_sampling(q, d, p, acc, emit, seed=0)
    _, a0, e0 = specops.chain_speculative_sampling(q, d, p, seed=0)
    assert torch.equal(acc, big + a0.long()) and torch.equal(emit, big + e0.long())


# ----------------------------------------------------------------------------------------------
# Generators and seeds


def spread_inputs(batch=64):
    # Uniform rows over 1000 tokens and rejected drafts: two calls with different randomness give
    # different tokens with probability ~1.
    p = torch.full((batch, 3, 1000), 1e-3)
    d = torch.zeros(batch, 2, dtype=torch.int64)
    p[:, :2, 0] = 0
    return None, d, p


def test_default_generator_reproducible_and_fresh():
    args = spread_inputs()
    torch.manual_seed(0)
    first = [specops.chain_speculative_sampling(*args)[0] for _ in range(3)]
    torch.manual_seed(0)
    again = [specops.chain_speculative_sampling(*args)[0] for _ in range(3)]
    for a, b in zip(first, again):
        assert torch.equal(a, b)
    assert not torch.equal(first[0], first[1]) and not torch.equal(first[1], first[2])
    torch.manual_seed(1)
    assert not torch.equal(specops.chain_speculative_sampling(*args)[0], first[0])


def test_explicit_generator():
    args = spread_inputs()
    torch.manual_seed(0)
    default_state = torch.get_rng_state()
    g1 = torch.Generator().manual_seed(5)
    g2 = torch.Generator().manual_seed(5)
    a1 = specops.chain_speculative_sampling(*args, generator=g1)[0]
    a2 = specops.chain_speculative_sampling(*args, generator=g2)[0]
    assert torch.equal(a1, a2)
    # The generator advances (fresh next call); the default generator is not touched.
    state = g1.get_state()
    b1 = specops.chain_speculative_sampling(*args, generator=g1)[0]
    assert not torch.equal(a1, b1)
    assert not torch.equal(state, g1.get_state())
    assert torch.equal(torch.get_rng_state(), default_state)
    # With an explicit seed the generator is not used at all.
    state = g1.get_state()
    specops.chain_speculative_sampling(*args, generator=g1, seed=3)
    assert torch.equal(state, g1.get_state())
    # seed=None with an offset: the drawn seed, the given offset (reproducible; the offset matters).
    c = [specops.chain_speculative_sampling(*args, generator=torch.Generator().manual_seed(8),
                                            offset=k)[0] for k in (4, 4, 5)]
    assert torch.equal(c[0], c[1]) and not torch.equal(c[0], c[2])


def test_same_seed_and_offset_same_output():
    args = spread_inputs()
    ref = specops.chain_speculative_sampling(*args, seed=10, offset=4)[0]
    assert torch.equal(ref, specops.chain_speculative_sampling(*args, seed=10, offset=4)[0])
    # Offset defaults to 0.
    assert torch.equal(
        specops.chain_speculative_sampling(*args, seed=10)[0],
        specops.chain_speculative_sampling(*args, seed=10, offset=0)[0],
    )
    assert not torch.equal(ref, specops.chain_speculative_sampling(*args, seed=10, offset=5)[0])
    assert not torch.equal(ref, specops.chain_speculative_sampling(*args, seed=11, offset=4)[0])
    # Offsets differing only in the high 32-bit word are different streams too.
    assert not torch.equal(
        ref, specops.chain_speculative_sampling(*args, seed=10, offset=4 + 2**32)[0]
    )


def test_single_seed_streams_differ_by_row():
    # One seed for the batch: identical requests in different rows get different randomness.
    _, d, p = spread_inputs(64)
    out = specops.chain_speculative_sampling(None, d, p, seed=1)[0]
    assert torch.unique(out[:, 0]).numel() > 30


def test_per_request_seeds_batch_invariance():
    batch = 12
    q, d, p = make_inputs(batch, 3, 2100, seed=4)  # > 2 chunks: race uniforms matter too
    d[5, 2] = -1
    d[7, 0] = 5000
    seeds = torch.arange(batch) * 31 - 200
    offsets = torch.arange(batch) + 7
    out, acc, emit = specops.chain_speculative_sampling(q, d, p, seed=seeds, offset=offsets)
    # Alone: each request with its own seed and offset.
    for b in range(batch):
        o1, a1, e1 = specops.chain_speculative_sampling(
            q[b : b + 1], d[b : b + 1], p[b : b + 1], seed=seeds[b : b + 1], offset=offsets[b : b + 1]
        )
        assert torch.equal(o1[0], out[b]) and a1.item() == acc[b] and e1.item() == emit[b], b
    # Permuted, and next to different neighbours.
    perm = torch.randperm(batch, generator=torch.Generator().manual_seed(0))
    o2, a2, e2 = specops.chain_speculative_sampling(
        q[perm], d[perm], p[perm], seed=seeds[perm], offset=offsets[perm]
    )
    assert torch.equal(o2, out[perm]) and torch.equal(a2, acc[perm]) and torch.equal(e2, emit[perm])
    q3, d3, p3 = make_inputs(batch, 3, 2100, seed=99)
    keep = torch.arange(batch) % 3 == 0
    q3[keep], d3[keep], p3[keep] = q[keep], d[keep], p[keep]
    o3 = specops.chain_speculative_sampling(q3, d3, p3, seed=seeds, offset=offsets)[0]
    assert torch.equal(o3[keep], out[keep])
    # A single shared offset broadcasts with per-request seeds.
    o4 = specops.chain_speculative_sampling(q, d, p, seed=seeds, offset=3)[0]
    o5 = specops.chain_speculative_sampling(q[perm], d[perm], p[perm], seed=seeds[perm], offset=3)[0]
    assert torch.equal(o5, o4[perm])


def test_empty_batch():
    for with_draft in (True, False):
        q, d, p = make_inputs(0, 3, 20, with_draft=with_draft)
        out, acc, emit = specops.chain_speculative_sampling(q, d, p, seed=1)
        assert out.shape == (0, 4) and out.dtype == torch.int32
        assert acc.shape == (0,) and emit.shape == (0,)
        out, acc, emit = specops.chain_speculative_sampling(q, d, p)  # generator path
        assert out.shape == (0, 4)
        a, e = counters(0, torch.int64)
        assert OP(q, d, p, a, e, torch.zeros(1, dtype=torch.int64), torch.zeros(1, dtype=torch.int64)).shape == (0, 4)


@pytest.mark.parametrize("with_draft", [True, False])
def test_reference_asks_no_data_questions_off_cpu(with_draft):
    """Off CPU the reference must not read data on the host (a GPU would synchronise, and CUDA-graph
    capture would fail): its CPU-only shortcuts are off there. On the meta device any such read
    raises, so running it there end to end shows there is none."""
    from specops.chain.token.reference import chain_speculative_sampling_reference

    batch, num_draft, vocab = 4, 3, 3000
    meta = dict(device="meta")
    draft = torch.empty(batch, num_draft, vocab, **meta) if with_draft else None
    target = torch.empty(batch, num_draft + 1, vocab, **meta)
    ids = torch.empty(batch, num_draft, dtype=torch.int64, **meta)
    counters = [torch.empty(batch, dtype=torch.int32, **meta) for _ in range(2)]
    seed = offset = torch.empty(batch, dtype=torch.int64, **meta)
    out = chain_speculative_sampling_reference(draft, ids, target, *counters, seed, offset)
    assert out.shape == (batch, num_draft + 1) and out.dtype == torch.int32


# ----------------------------------------------------------------------------------------------
# generator= under torch.compile: Dynamo cannot pass a torch.Generator to an op, so the public
# function says what to do instead, and doing it gives the tokens generator= gives eagerly.


def _with_generator(q, d, p, generator):
    return specops.chain_speculative_sampling(q, d, p, generator=generator)[0]


def _with_drawn_seed(q, d, p, seed, offset):
    return specops.chain_speculative_sampling(q, d, p, seed=seed, offset=offset)[0]


@pytest.mark.parametrize("backend", ["aot_eager", "inductor"])
def test_generator_under_compile(backend):
    torch._dynamo.reset()
    q, d, p = make_inputs(6, 3, 1500, seed=5)
    # The remedy stands in the error's first lines (torch releases whose compiler.disable takes no
    # reason say that the draw was kept out of the graph: docs/recipes.md).
    takes_reason = "reason" in inspect.signature(torch.compiler.disable).parameters
    expected = "cannot be traced by torch.compile" if takes_reason else "torch.compiler.disable"
    with pytest.raises(Exception) as raised:
        torch.compile(_with_generator, fullgraph=True, backend=backend)(
            q, d, p, torch.Generator().manual_seed(3))
    assert expected in "\n".join(str(raised.value).splitlines()[:3]), str(raised.value)
    # Without fullgraph=True, Dynamo breaks the graph there and the call runs eagerly.
    broken = torch.compile(_with_generator, backend=backend)(q, d, p,
                                                             torch.Generator().manual_seed(3))
    assert torch.equal(broken, _with_generator(q, d, p, torch.Generator().manual_seed(3)))
    # The documented replacement (docs/recipes.md): draw outside, pass the tensors in.
    compiled = torch.compile(_with_drawn_seed, fullgraph=True, backend=backend)
    eager_gen, outside_gen = torch.Generator().manual_seed(3), torch.Generator().manual_seed(3)
    for _ in range(3):  # the generator advances identically: every step matches
        expected = _with_generator(q, d, p, eager_gen)
        drawn = torch.randint(-2**63, 2**63 - 1, (2,), dtype=torch.int64, generator=outside_gen)
        assert torch.equal(compiled(q, d, p, drawn[:1], drawn[1:]), expected)


# ----------------------------------------------------------------------------------------------
# Seeds of another integer dtype: converted by an op each call, so a compiled or captured graph
# sees their current values (docs/recipes.md, "CUDA graphs: per-request seeds updated in place").


def _int32_seeded(q, d, p, seed32, offset32):
    return specops.chain_speculative_sampling(q, d, p, seed=seed32, offset=offset32)[0]


def test_int32_seed_tensors_are_read_each_call():
    torch._dynamo.reset()
    q, d, p = make_inputs(6, 3, 1500, seed=6)
    seed32 = torch.arange(6, dtype=torch.int32) + 100
    offset32 = torch.zeros(6, dtype=torch.int32)
    compiled = torch.compile(_int32_seeded, fullgraph=True, backend="aot_eager")
    for step in range(3):
        offset32 += 1  # in place, as a serving loop advances its offsets
        seed32[2] = 7 + step
        expected = specops.chain_speculative_sampling(q, d, p, seed=seed32.long(),
                                                      offset=offset32.long())[0]
        assert torch.equal(_int32_seeded(q, d, p, seed32, offset32), expected)
        assert torch.equal(compiled(q, d, p, seed32, offset32), expected)


# ----------------------------------------------------------------------------------------------
# CUDA graphs under mode="reduce-overhead", checked on CPU: inductor keeps the graph when every
# input the graph mutates is a static input (torch/_inductor/cudagraph_utils.py). The mutated
# inputs must be exactly the counters, and marking them static (docs/recipes.md) must make them so.


@pytest.mark.parametrize("mark_static", [True, False])
def test_only_the_counters_are_mutated_and_static_when_marked(mark_static):
    from functorch.compile import make_boxed_func
    from torch._dynamo.backends.common import aot_autograd

    seen = {}

    def forward_compiler(gm, example_inputs):
        seen["graph"] = gm.graph
        return make_boxed_func(gm.forward)

    def backend(gm, example_inputs):
        # As inductor computes static_input_idxs: inputs Dynamo marked static.
        seen["static"] = {i for i, x in enumerate(example_inputs)
                          if getattr(x, "_dynamo_static_input_type", None) is not None}
        return aot_autograd(fw_compiler=forward_compiler)(gm, example_inputs)

    torch._dynamo.reset()
    batch = 4
    acc, emit = counters(batch, torch.int64)
    if mark_static:
        torch._dynamo.mark_static_address(acc)
        torch._dynamo.mark_static_address(emit)

    def step(q, d, p, seeds, offsets):
        return specops.chain_speculative_sampling(q, d, p, acc, emit, seed=seeds, offset=offsets)[0]

    q, d, p = make_inputs(batch, 2, 100)
    seeds, offsets = torch.arange(batch), torch.zeros(batch, dtype=torch.int64)
    compiled = torch.compile(step, fullgraph=True, backend=backend)
    acc_e, emit_e = counters(batch, torch.int64)
    expected = specops.chain_speculative_sampling(q, d, p, acc_e, emit_e, seed=seeds, offset=offsets)[0]
    assert torch.equal(compiled(q, d, p, seeds, offsets), expected)
    assert torch.equal(acc, acc_e) and torch.equal(emit, emit_e)

    placeholders = [n for n in seen["graph"].nodes if n.op == "placeholder"]
    (node,) = [n for n in seen["graph"].nodes
               if n.target is torch.ops.higher_order.auto_functionalized_v2]
    mutated = {placeholders.index(base) for base in node.kwargs["_all_bases"]}
    assert len(mutated) == 2  # the two counters, and nothing else
    assert mutated <= seen["static"] if mark_static else not mutated & seen["static"]


# ----------------------------------------------------------------------------------------------
# The defaults a newcomer may pass explicitly (docs/api.md).


def test_an_offset_given_with_a_drawn_seed_replaces_the_drawn_offset():
    q, d, p = make_inputs(6, 3, 1500, seed=8)
    torch.manual_seed(11)
    given = specops.chain_speculative_sampling(q, d, p, seed=None, offset=5)[0]
    torch.manual_seed(11)
    drawn = torch.randint(-2**63, 2**63 - 1, (2,), dtype=torch.int64)
    assert torch.equal(given, specops.chain_speculative_sampling(q, d, p, seed=drawn[:1],
                                                                 offset=5)[0])


def test_temperature_none_is_one():
    torch.manual_seed(3)
    logits = torch.randn(4, 4, 50)
    ids = torch.randint(0, 50, (4, 3))
    none = specops.chain_speculative_sampling_from_logits(None, ids, logits, temperature=None,
                                                          top_p=0.8, seed=2)[0]
    one = specops.chain_speculative_sampling_from_logits(None, ids, logits, temperature=1.0,
                                                         top_p=0.8, seed=2)[0]
    assert torch.equal(none, one)
