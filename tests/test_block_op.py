"""Block verification's registered op and the public function's ``verification`` argument:
registration (opcheck, schema), fixed-seed outputs, torch.compile, counters, bad arguments."""

from __future__ import annotations

import pytest
import torch

import specops
from specops.chain.block.reference import block_speculative_sampling_reference
from specops.chain.verifier import SCHEMA as VERIFIER_SCHEMA

from inputs import counters, softmax_inputs as make_inputs  # tests/inputs.py

OP = torch.ops.specops.chain_block_speculative_sampling


@pytest.mark.parametrize("with_draft,dtype,id_dtype,counter_dtype,per_request", [
    (True, torch.float32, torch.int64, torch.int32, False),
    (False, torch.float16, torch.int32, torch.int64, True),
    (True, torch.bfloat16, torch.int32, torch.int64, True),
])
def test_opcheck(with_draft, dtype, id_dtype, counter_dtype, per_request):
    q, d, p = make_inputs(dtype=dtype, id_dtype=id_dtype, with_draft=with_draft)
    acc, emit = counters(4, counter_dtype)
    seed = torch.tensor([1, 2, 3, 4]) if per_request else torch.tensor([7])
    torch.library.opcheck(OP, (q, d, p, acc, emit, seed, torch.tensor([0]), True))


def test_schema_is_the_chain_schema():
    chain = str(torch.ops.specops.chain_speculative_sampling.default._schema)
    block = str(OP.default._schema)
    assert block.replace("chain_block_speculative_sampling", "chain_speculative_sampling") == chain
    assert VERIFIER_SCHEMA.split(" -> ")[0].lstrip("(") in block


def test_public_function_selects_the_mode():
    q, d, p = make_inputs(6, 3, 40, seed=1)
    out_b, acc_b, emit_b = specops.chain_speculative_sampling(q, d, p, seed=5, verification="block")
    acc, emit = counters(6)
    expected = block_speculative_sampling_reference(q, d, p, acc, emit, torch.tensor([5]), torch.tensor([0]))
    assert torch.equal(out_b, expected) and torch.equal(acc_b, acc) and torch.equal(emit_b, emit)
    # The default is token verification, unchanged.
    out_t, acc_t, _ = specops.chain_speculative_sampling(q, d, p, seed=5)
    out_t2, _, _ = specops.chain_speculative_sampling(q, d, p, seed=5, verification="token")
    assert torch.equal(out_t, out_t2)
    # The alignment counter uses token verification's coins: the same in both modes.
    assert torch.equal(acc_t, acc_b)


@pytest.mark.parametrize("bad", ["Block", "tree", "", None, 1])
def test_bad_verification_is_a_value_error(bad):
    q, d, p = make_inputs()
    with pytest.raises(ValueError, match='verification must be "token" or "block"'):
        specops.chain_speculative_sampling(q, d, p, seed=1, verification=bad)


def test_bad_arguments_name_the_argument():
    q, d, p = make_inputs()
    acc, emit = counters(4)
    with pytest.raises(ValueError, match="draft_token_ids"):
        OP(q, d[:, :2], p, acc, emit, torch.tensor([1]), torch.tensor([0]))
    with pytest.raises(TypeError, match="draft_probs"):
        OP(q.half(), d, p, acc, emit, torch.tensor([1]), torch.tensor([0]))


def test_fixed_seed_output():
    q, d, p = make_inputs(4, 3, 16, seed=0)
    out, acc, emit = specops.chain_speculative_sampling(q, d, p, seed=1234, verification="block")
    again, _, _ = specops.chain_speculative_sampling(q, d, p, seed=1234, verification="block")
    assert torch.equal(out, again)
    # Output layout: kept drafts, the token, then -1.
    for b in range(4):
        tau = int(emit[b])
        assert torch.equal(out[b, :tau].long(), d[b, :tau])
        assert out[b, tau] >= 0 and (out[b, tau + 1 :] == -1).all()


def _op_fn(q, d, p, acc, emit, seed, offset):
    return OP(q, d, p, acc, emit, seed, offset)


def _wrapper_fn(q, d, p, acc, emit):
    return specops.chain_speculative_sampling(q, d, p, acc, emit, seed=1234, offset=9,
                                              verification="block")


@pytest.mark.parametrize("backend", ["aot_eager", "inductor"])
def test_compile_matches_eager(backend):
    torch._dynamo.reset()
    batch = 6
    q, d, p = make_inputs(batch, 3, 1500, seed=3)
    d[0, 1] = -1
    seeds, offsets = torch.tensor([3, -4, 5, 6, 7, 8]), torch.tensor([11])
    acc_e, emit_e = counters(batch, torch.int64)
    out_e = _op_fn(q, d, p, acc_e, emit_e, seeds, offsets)
    acc_c, emit_c = counters(batch, torch.int64)
    compiled = torch.compile(_op_fn, fullgraph=True, backend=backend)
    out_c = compiled(q, d, p, acc_c, emit_c, seeds, offsets)
    assert torch.equal(out_c, out_e) and torch.equal(acc_c, acc_e) and torch.equal(emit_c, emit_e)

    acc_w, emit_w = counters(batch)
    out_w, _, _ = _wrapper_fn(q, d, p, acc_w, emit_w)
    acc_wc, emit_wc = counters(batch)
    out_wc, _, _ = torch.compile(_wrapper_fn, fullgraph=True, backend=backend)(q, d, p, acc_wc, emit_wc)
    assert torch.equal(out_wc, out_w) and torch.equal(acc_wc, acc_w) and torch.equal(emit_wc, emit_w)


def test_empty_batch():
    q, d, p = make_inputs(0, 2, 8)
    out, acc, emit = specops.chain_speculative_sampling(q, d, p, seed=1, verification="block")
    assert out.shape == (0, 3) and acc.shape == (0,)
