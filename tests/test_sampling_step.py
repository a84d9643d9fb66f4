"""Rule step 0 (core/logits/rule.py) on the target's logits: a grammar mask
(``allowed_token_bitmask``), a logit bias and the penalties. Every function that verifies from
logits gives the tokens it gives the logits adjusted by hand (mask -inf, bias added, penalties with
the drafts before each row, or the path to each node, counted as generated); a draft outside its
mask is never accepted; greedy rows take the argmax inside the mask; the arguments' checks name
them; the ops pass opcheck; the Triton path (interpreter) gives the reference's tokens, the
flattened layout's per-request tensors included. The distributions:
tests/test_logits_statistics.py."""

from __future__ import annotations

import pytest
import torch
from inputs import DEVICE  # tests/inputs.py (conftest.py: TRITON_INTERPRET=1 on CPU)

import specops
import specops.varlen
from specops.chain.block.launch import block_speculative_sampling_from_logits_triton
from specops.chain.block.reference import block_speculative_sampling_from_logits_reference
from specops.chain.token.launch import chain_speculative_sampling_from_logits_triton
from specops.chain.token.reference import chain_speculative_sampling_from_logits_reference
from specops.core.logits import rule
from specops.core.logits.rule import packed_bitmask
from specops.varlen import op as varlen_op

B, N, V = 4, 3, 70  # three words of mask, the last one partial


def step_inputs(seed=0, batch=B, num_draft=N, vocab=V):
    """(target logits, draft logits, ids, logit bias, allowed (bool), bitmask): about a third of
    the tokens allowed per row, every row allowing some; some drafts outside their masks."""
    g = torch.Generator().manual_seed(seed)
    target = 2 * torch.randn(batch, num_draft + 1, vocab, generator=g)
    draft = target[:, :num_draft] + torch.randn(batch, num_draft, vocab, generator=g)
    ids = torch.randint(0, vocab, (batch, num_draft), generator=g)
    bias = torch.randn(batch, vocab, generator=g)
    bias[:, :3] = -torch.inf  # banned tokens
    allowed = torch.rand(batch, num_draft + 1, vocab, generator=g) < 0.35
    allowed[..., 5] = True
    return target, draft, ids, bias, allowed, packed_bitmask(allowed)


def by_hand(target, bias, allowed):
    """Rule step 0 written out: -inf outside the mask, x + bias (float32) inside."""
    return torch.where(allowed, target.float() + bias.float()[:, None, :], -torch.inf)


def test_bitmask_layout_is_the_shared_one():
    allowed = torch.zeros(2, 70, dtype=torch.bool)
    allowed[0, [0, 31, 32, 69]] = True
    allowed[1, 63] = True
    mask = packed_bitmask(allowed)
    assert mask[0].tolist() == [1 | -2**31, 1, 1 << 5] and mask[1].tolist() == [0, -2**31, 0]
    assert torch.equal(rule.allowed_tokens(mask, 70), allowed)
    # What step 0 adds: 0 where allowed, -inf where not (the sign bit, bit 31, included).
    assert torch.equal(rule.blocked(mask, 70), torch.where(allowed, 0.0, -torch.inf))


PARAMETERS = dict(temperature=torch.tensor([0.0, 1.0, 0.7, 1.2]), top_k=torch.tensor([0, 0, 5, 0]),
                  top_p=torch.tensor([1.0, 0.9, 1.0, 1.0]), min_p=torch.tensor([0.0, 0.0, 0.0, 0.1]))


def _chain(verification, target, ids, draft=None, **kwargs):
    return specops.chain_speculative_sampling_from_logits(
        None, ids, target, draft_logits=draft, seed=torch.arange(B), verification=verification,
        **PARAMETERS, **kwargs)[:2]


@pytest.mark.parametrize("verification", ["token", "block"])
@pytest.mark.parametrize("drafts", ["logits", "greedy"])
def test_chain_verifies_the_adjusted_logits(verification, drafts):
    target, draft, ids, bias, allowed, mask = step_inputs()
    draft = draft if drafts == "logits" else None
    for given, by in ((dict(logit_bias=bias), by_hand(target, bias, torch.ones_like(allowed))),
                      (dict(allowed_token_bitmask=mask), by_hand(target, 0 * bias, allowed)),
                      (dict(logit_bias=bias, allowed_token_bitmask=mask),
                       by_hand(target, bias, allowed))):
        out, acc = _chain(verification, target, ids, draft, **given)
        expected, expected_acc = _chain(verification, by, ids, draft)
        assert torch.equal(out, expected) and torch.equal(acc, expected_acc)
    plain, _ = _chain(verification, target, ids, draft)
    assert not torch.equal(plain, out)  # the adjustments count


def test_varlen_and_tree_verify_the_adjusted_logits():
    target, draft, ids, bias, allowed, mask = step_inputs(seed=1)
    adjusted = by_hand(target, bias, allowed)
    # Varlen: every request's N drafts, flattened; per-request bias, per-row masks.
    cu = torch.arange(B + 1) * N
    flat = dict(seed=torch.arange(B), **PARAMETERS)
    out = specops.varlen.chain_speculative_sampling_from_logits(
        None, ids.reshape(-1), target.reshape(-1, V), cu, N, logit_bias=bias,
        allowed_token_bitmask=mask.reshape(-1, mask.shape[-1]), **flat)[0]
    assert torch.equal(out, _chain("token", adjusted, ids)[0])
    # A tree: a chain of nodes, its rows the chain's.
    parents = torch.arange(N).expand(B, N)
    tree = dict(seed=torch.arange(B), **PARAMETERS)
    out = specops.tree_speculative_sampling_from_logits(
        None, ids, parents, target, logit_bias=bias, allowed_token_bitmask=mask, **tree)[0]
    assert torch.equal(out, specops.tree_speculative_sampling_from_logits(
        None, ids, parents, adjusted, **tree)[0])


@pytest.mark.parametrize("verification", ["token", "block"])
def test_a_draft_outside_its_mask_is_never_accepted(verification):
    target, draft, ids, bias, allowed, mask = step_inputs(seed=2)
    ids = target[:, :N].argmax(-1)  # the target's favourites, which block verification keeps
    allowed[:, 1] = True
    allowed[torch.arange(B), 1, ids[:, 1]] = False  # position 1's draft: outside its mask
    for seed in range(20):
        out, _, _ = specops.chain_speculative_sampling_from_logits(
            None, ids, target, allowed_token_bitmask=packed_bitmask(allowed), seed=seed,
            verification=verification)
        assert (out[:, 1] != ids[:, 1]).all()
        emitted = out[out >= 0]
        rows = torch.nonzero(out >= 0)
        assert allowed[rows[:, 0], rows[:, 1], emitted.long()].all()  # every token allowed


def test_greedy_rows_take_the_argmax_inside_the_mask():
    target, _, _, bias, allowed, mask = step_inputs(seed=3)
    best = by_hand(target, bias, allowed).argmax(-1)  # (B, N + 1)
    out, _, _ = specops.chain_speculative_sampling_from_logits(
        None, best[:, :N], target, temperature=0.0, logit_bias=bias, allowed_token_bitmask=mask,
        seed=0)
    assert torch.equal(out.long(), best)


def test_a_mask_allowing_nothing_finite_gives_no_mass():
    target, _, ids, _, allowed, _ = step_inputs(seed=4)
    allowed[1, 0] = False  # request 1, position 0: nothing allowed
    out, _, _ = specops.chain_speculative_sampling_from_logits(
        None, ids, target, allowed_token_bitmask=packed_bitmask(allowed), seed=0)
    assert out[1, 0] == -1 and (out[1] == -1).all()


@pytest.mark.parametrize("changes, error, fragment", [
    (dict(logit_bias=torch.zeros(B, V + 1)), ValueError,
     "logit_bias must have shape (batch_size, vocab_size) = (4, 70)"),
    (dict(logit_bias=torch.zeros(B, V, dtype=torch.float64)), TypeError,
     "logit_bias must have dtype float32 or float16 or bfloat16"),
    (dict(logit_bias=[0.0] * V), TypeError, "logit_bias must be a tensor"),
    (dict(allowed_token_bitmask=torch.zeros(B, N + 1, 2, dtype=torch.int32)), ValueError,
     "allowed_token_bitmask must have shape (batch_size, num_speculate_tokens + 1, "
     "ceil(vocab_size / 32)) = (4, 4, 3)"),
    (dict(allowed_token_bitmask=torch.zeros(B, N + 1, 3, dtype=torch.int64)), TypeError,
     "allowed_token_bitmask must have dtype int32"),
])
def test_the_arguments_are_checked_by_name(changes, error, fragment):
    target, _, ids, _, _, _ = step_inputs()
    call = lambda: specops.chain_speculative_sampling_from_logits(  # noqa: E731
        None, ids, target, seed=1, **changes)
    with pytest.raises(error, match=pytest.importorskip("re").escape(fragment)):
        call()
    if isinstance(changes.get("logit_bias"), list):
        return
    torch._dynamo.reset()
    with pytest.raises(Exception, match=pytest.importorskip("re").escape(fragment)):
        torch.compile(call, backend="aot_eager", fullgraph=True)()


def test_varlen_and_tree_masks_have_their_rows_shapes():
    target, _, ids, _, _, _ = step_inputs()
    words = torch.zeros(B * (N + 1) - 1, 3, dtype=torch.int32)
    with pytest.raises(ValueError, match=r"allowed_token_bitmask must have shape \(num_tokens \+ "
                                         r"batch_size, ceil\(vocab_size / 32\)\) = \(16, 3\)"):
        specops.varlen.chain_speculative_sampling_from_logits(
            None, ids.reshape(-1), target.reshape(-1, V), torch.arange(B + 1) * N, N,
            allowed_token_bitmask=words, seed=1)
    with pytest.raises(ValueError, match=r"allowed_token_bitmask must have shape \(batch_size, "
                                         r"num_nodes \+ 1, ceil\(vocab_size / 32\)\)"):
        specops.tree_speculative_sampling_from_logits(
            None, ids, torch.arange(N).expand(B, N), target,
            allowed_token_bitmask=words[:B], seed=1)


def test_a_bias_of_nan_or_inf_is_refused_under_validation(monkeypatch):
    target, _, ids, bias, _, _ = step_inputs()
    bias[2, 7] = torch.inf
    specops.chain_speculative_sampling_from_logits(None, ids, target, logit_bias=bias, seed=1)
    monkeypatch.setenv("SPECOPS_VALIDATE", "1")
    with pytest.raises(ValueError, match=r"logit_bias must be a number or -inf; got inf at index "
                                         r"\(2, 7\)"):
        specops.chain_speculative_sampling_from_logits(None, ids, target, logit_bias=bias, seed=1)


def test_opcheck():
    target, draft, ids, bias, _, mask = step_inputs()
    params = tuple(PARAMETERS.values())
    seeds = (torch.tensor([3]), torch.tensor([0]))
    for op in (torch.ops.specops.chain_speculative_sampling_from_logits,
               torch.ops.specops.chain_block_speculative_sampling_from_logits):
        torch.library.opcheck(op, (None, ids, target, draft, *seeds, *params,
                                   None, None, None, None, bias, mask))
    flat_mask = mask.reshape(-1, mask.shape[-1])
    torch.library.opcheck(varlen_op.varlen_chain_speculative_sampling_from_logits_op, (
        None, ids.reshape(-1), target.reshape(-1, V), torch.arange(B + 1) * N, N, None,
        *seeds, *params, None, None, None, None, bias, flat_mask))
    torch.library.opcheck(torch.ops.specops.tree_speculative_sampling_from_logits, (
        None, ids, torch.arange(N).expand(B, N), target, None, *seeds, *params, True,
        None, None, None, None, bias, mask))


# ---------------------------------------------------------------------------------------------
# The Triton path against the reference (interpreter on CPU)

@pytest.mark.interpreter
@pytest.mark.parametrize("verification", ["token", "block"])
def test_triton_path_matches_reference(verification):
    """Every part of step 0 at once, in transformers' order: the kernels' tokens and counts are
    the reference's."""
    target, draft, ids, bias, _, mask = step_inputs(seed=5, vocab=100)
    reference, triton = {"token": (chain_speculative_sampling_from_logits_reference,
                                   chain_speculative_sampling_from_logits_triton),
                         "block": (block_speculative_sampling_from_logits_reference,
                                   block_speculative_sampling_from_logits_triton)}[verification]
    temperature = torch.tensor([0.0, 1.0, 0.7, 1.2], device=DEVICE)
    off = (torch.zeros(1, dtype=torch.int64, device=DEVICE), torch.ones(1, device=DEVICE),
           torch.full((1,), 0.05, device=DEVICE))
    counts = (torch.arange(B * 100).reshape(B, 100) % 7 == 0).int()
    ids[:, 1] = ids[:, 0]  # a repeated draft, counted at row 2
    penalties = (torch.tensor([1.5], device=DEVICE), torch.tensor([0.5], device=DEVICE),
                 torch.tensor([0.8], device=DEVICE), counts.to(DEVICE),
                 (counts.roll(3, 1) > 0).to(DEVICE))
    results = []
    for fn in (reference, triton):
        acc = torch.zeros(B, dtype=torch.int32, device=DEVICE)
        emit = torch.zeros(B, dtype=torch.int32, device=DEVICE)
        out = fn(None, ids.to(DEVICE), target.to(DEVICE), draft.to(DEVICE), acc, emit,
                 torch.arange(B, device=DEVICE), torch.zeros(1, dtype=torch.int64, device=DEVICE),
                 temperature, *off, None, None, None, None, bias.to(DEVICE), mask.to(DEVICE),
                 *penalties, "transformers")
        results.append((out, acc, emit))
    (out_r, acc_r, emit_r), (out_k, acc_k, emit_k) = results
    assert torch.equal(out_k, out_r) and torch.equal(acc_k, acc_r) and torch.equal(emit_k, emit_r)


@pytest.mark.interpreter
def test_triton_path_gives_a_flattened_batch_each_requests_bias():
    counts = [2, 0, 3, 1]
    target, _, _, bias, _, _ = step_inputs(seed=6, num_draft=3, vocab=100)
    g = torch.Generator().manual_seed(7)
    rows = torch.cat([target[b, :n + 1] for b, n in enumerate(counts)])  # (T + B, V)
    ids = torch.randint(0, 100, (sum(counts),), generator=g)
    allowed = torch.rand(rows.shape[0], 100, generator=g) < 0.5
    cu = torch.tensor([0, *counts]).cumsum(0)
    kwargs = dict(temperature=torch.tensor([1.0, 0.0, 0.8, 1.0], device=DEVICE),
                  seed=torch.arange(4, device=DEVICE), logit_bias=bias.to(DEVICE),
                  allowed_token_bitmask=packed_bitmask(allowed).to(DEVICE))
    outs = []
    for backend in ("torch", "triton"):
        with pytest.MonkeyPatch.context() as patch:
            patch.setenv("SPECOPS_BACKEND", backend)
            outs.append(specops.varlen.chain_speculative_sampling_from_logits(
                None, ids.to(DEVICE), rows.to(DEVICE), cu.to(DEVICE), 3, **kwargs)[0])
    assert torch.equal(outs[0].cpu(), outs[1].cpu())


# ---------------------------------------------------------------------------------------------
# Penalties

PENALTIES = dict(repetition_penalty=torch.tensor([1.3, 1.0, 0.8, 2.0]), frequency_penalty=0.4,
                 presence_penalty=torch.tensor([0.0, 0.5, 1.0, -0.5]))


def penalty_inputs(seed=8):
    target, draft, ids, _, _, _ = step_inputs(seed=seed)
    g = torch.Generator().manual_seed(seed)
    counts = torch.randint(0, 3, (B, V), generator=g) * (torch.rand(B, V, generator=g) < 0.2)
    prompt = torch.rand(B, V, generator=g) < 0.1
    ids[:, 1] = ids[:, 0]  # a draft repeated: its second row counts it once more
    return target, draft, ids, counts, prompt


def penalised_by_hand(target, ids, counts, prompt, rep, freq, pres):
    """Each row (B, N + 1, V) with row j's counts: the output's and drafts 0..j-1 (float32, in
    vLLM's order), written position by position."""
    rows = []
    for j in range(target.shape[1]):
        generated = counts.clone()
        for i in range(j):
            generated[torch.arange(B), ids[:, i]] += 1
        x = target[:, j].float()
        seen = (generated > 0) | prompt
        r = rep.float()[:, None]
        x = torch.where(seen, torch.where(x > 0, x / r, x * r), x)
        x = x - freq.float()[:, None] * generated.float()
        rows.append(x - pres.float()[:, None] * (generated > 0).float())
    return torch.stack(rows, dim=1)


def _values(name):
    return torch.as_tensor(PENALTIES[name], dtype=torch.float32).expand(B)


@pytest.mark.parametrize("verification", ["token", "block"])
def test_penalties_count_the_output_the_prompt_and_the_drafts_before(verification):
    target, draft, ids, counts, prompt = penalty_inputs()
    by = penalised_by_hand(target, ids, counts, prompt, *map(_values, PENALTIES))
    for drafts in (draft, None):
        got = _chain(verification, target, ids, drafts, output_token_counts=counts,
                     prompt_token_mask=prompt, **PENALTIES)
        assert all(map(torch.equal, got, _chain(verification, by, ids, drafts)))
    assert not torch.equal(got[0], _chain(verification, target, ids)[0])


def test_penalties_in_a_flattened_batch_and_a_tree():
    target, draft, ids, counts, prompt = penalty_inputs(seed=9)
    by = penalised_by_hand(target, ids, counts, prompt, *map(_values, PENALTIES))
    given = dict(output_token_counts=counts, prompt_token_mask=prompt, **PENALTIES)
    cu = torch.arange(B + 1) * N
    out = specops.varlen.chain_speculative_sampling_from_logits(
        None, ids.reshape(-1), target.reshape(-1, V), cu, N, seed=torch.arange(B), **PARAMETERS,
        **given)[0]
    assert torch.equal(out, _chain("token", by, ids)[0])
    # A chain of nodes counts its path as the chain counts its drafts.
    parents = torch.arange(N).expand(B, N)
    tree = dict(seed=torch.arange(B), **PARAMETERS)
    out = specops.tree_speculative_sampling_from_logits(None, ids, parents, target, **tree,
                                                        **given)[0]
    assert torch.equal(out, specops.tree_speculative_sampling_from_logits(
        None, ids, parents, by, **tree)[0])


def test_a_tree_counts_each_nodes_path():
    from specops.tree.processed import tree_generated

    counts = torch.tensor([[1, 0, 0, 2, 0]])
    ids = torch.tensor([[3, 1, 1, -1, 4]])  # nodes 1..5; node 4 absent
    parents = torch.tensor([[0, 0, 1, 3, 2]])  # 1, 2 under the root; 3 under 1; 5 under 2
    generated = tree_generated(counts, ids, parents)
    expected = counts.repeat(6, 1)
    expected[1, 3] += 1  # node 1: token 3
    expected[2, 1] += 1  # node 2: token 1
    expected[3, [3, 1]] += 1  # node 3: its parent 1's token 3, its own 1
    expected[5, [1, 4]] += 1  # node 5: its parent 2's token 1, its own 4
    assert torch.equal(generated[0, [0, 1, 2, 3, 5]], expected[[0, 1, 2, 3, 5]])


def test_penalties_out_of_range_give_no_mass_and_are_refused(monkeypatch):
    target, _, ids, counts, _ = penalty_inputs()
    out = specops.chain_speculative_sampling_from_logits(
        None, ids, target, repetition_penalty=torch.tensor([1.0, 0.0, 1.0, 1.0]),
        output_token_counts=counts, seed=0)[0]
    assert (out[1] == -1).all() and (out[[0, 2, 3], 0] >= 0).all()
    with pytest.raises(ValueError, match=r"repetition_penalty must be a finite number > 0 "
                                         r"\(1: off\); got 0"):
        specops.chain_speculative_sampling_from_logits(
            None, ids, target, repetition_penalty=0, output_token_counts=counts, seed=0)
    monkeypatch.setenv("SPECOPS_VALIDATE", "1")
    with pytest.raises(ValueError, match=r"repetition_penalty must be .* at index \(1,\)"):
        specops.chain_speculative_sampling_from_logits(
            None, ids, target, repetition_penalty=torch.tensor([1.0, 0.0, 1.0, 1.0]),
            output_token_counts=counts, seed=0)
    with pytest.raises(ValueError, match=r"output_token_counts must be >= 0; got -1"):
        specops.chain_speculative_sampling_from_logits(
            None, ids, target, frequency_penalty=0.5, output_token_counts=counts - 1, seed=0)


@pytest.mark.parametrize("changes, error, fragment", [
    (dict(frequency_penalty=0.5), ValueError, "output_token_counts must be given with a penalty"),
    (dict(presence_penalty=0.5, output_token_counts=torch.zeros(B, V)), TypeError,
     "output_token_counts must have dtype int32 or int64"),
    (dict(presence_penalty=0.5, output_token_counts=torch.zeros(B, V - 1, dtype=torch.int32)),
     ValueError, "output_token_counts must have shape (batch_size, vocab_size) = (4, 70)"),
    (dict(repetition_penalty=1.2, output_token_counts=torch.zeros(B, V, dtype=torch.int32),
          prompt_token_mask=torch.zeros(B, V, dtype=torch.int32)), TypeError,
     "prompt_token_mask must have dtype bool"),
    (dict(repetition_penalty=torch.ones(3), output_token_counts=torch.zeros(B, V,
                                                                         dtype=torch.int32)),
     ValueError, "repetition_penalty must be a 1-D tensor of 1 or batch_size (4) elements"),
])
def test_penalty_arguments_are_checked_by_name(changes, error, fragment):
    target, _, ids, _, _ = penalty_inputs()
    call = lambda: specops.chain_speculative_sampling_from_logits(  # noqa: E731
        None, ids, target, seed=1, **changes)
    with pytest.raises(error, match=pytest.importorskip("re").escape(fragment)):
        call()
    torch._dynamo.reset()
    with pytest.raises(Exception, match=pytest.importorskip("re").escape(fragment)):
        torch.compile(call, backend="aot_eager", fullgraph=True)()


def test_opcheck_with_penalties():
    target, draft, ids, counts, prompt = penalty_inputs()
    penalties = (torch.tensor([1.3]), torch.full((B,), 0.2), None, counts, prompt)
    seeds = (torch.tensor([3]), torch.tensor([0]))
    params = tuple(PARAMETERS.values())
    for op in (torch.ops.specops.chain_speculative_sampling_from_logits,
               torch.ops.specops.chain_block_speculative_sampling_from_logits):
        torch.library.opcheck(op, (None, ids, target, draft, *seeds, *params,
                                   None, None, None, None, None, None, *penalties))
    torch.library.opcheck(torch.ops.specops.tree_speculative_sampling_from_logits, (
        None, ids, torch.arange(N).expand(B, N), target, None, *seeds, *params, True,
        None, None, None, None, None, None, *penalties))


@pytest.mark.interpreter
def test_triton_path_penalises_a_flattened_batch_as_the_reference():
    counts_per_request = [2, 0, 3, 1]
    target, _, _, bias, _, _ = step_inputs(seed=10, num_draft=3, vocab=100)
    g = torch.Generator().manual_seed(11)
    rows = torch.cat([target[b, :n + 1] for b, n in enumerate(counts_per_request)])
    ids = torch.randint(0, 100, (sum(counts_per_request),), generator=g)
    ids[3] = ids[2]  # request 2 repeats a draft
    cu = torch.tensor([0, *counts_per_request]).cumsum(0)
    counts = torch.randint(0, 3, (4, 100), generator=g) * (torch.rand(4, 100, generator=g) < 0.3)
    kwargs = dict(temperature=torch.tensor([1.0, 0.0, 0.8, 1.0], device=DEVICE),
                  seed=torch.arange(4, device=DEVICE), logit_bias=bias.to(DEVICE),
                  repetition_penalty=torch.tensor([1.5, 1.2, 2.0, 1.0], device=DEVICE),
                  frequency_penalty=0.7, presence_penalty=0.4,
                  output_token_counts=counts.to(DEVICE),
                  prompt_token_mask=(torch.rand(4, 100, generator=g) < 0.2).to(DEVICE))
    outs = []
    for backend in ("torch", "triton"):
        with pytest.MonkeyPatch.context() as patch:
            patch.setenv("SPECOPS_BACKEND", backend)
            outs.append(specops.varlen.chain_speculative_sampling_from_logits(
                None, ids.to(DEVICE), rows.to(DEVICE), cu.to(DEVICE), 3, **kwargs)[0].cpu())
    assert torch.equal(outs[0], outs[1])
    plain = {k: v for k, v in kwargs.items() if "penalty" not in k}
    assert not torch.equal(outs[0], specops.varlen.chain_speculative_sampling_from_logits(
        None, ids.to(DEVICE), rows.to(DEVICE), cu.to(DEVICE), 3, **plain)[0].cpu())


@pytest.mark.parametrize("verification", ["token", "block"])
def test_penalties_without_drafts(verification):
    """N = 0 (and a flattened step of no drafts, T = 0): the one row counts the output only."""
    target, _, _, counts, prompt = penalty_inputs()
    given = dict(output_token_counts=counts, prompt_token_mask=prompt, **PENALTIES)
    none = torch.empty(B, 0, dtype=torch.int64)
    by = penalised_by_hand(target[:, :1], none, counts, prompt, *map(_values, PENALTIES))
    out = _chain(verification, target[:, :1], none, **given)[0]
    assert torch.equal(out, _chain(verification, by, none)[0])
    flat = specops.varlen.chain_speculative_sampling_from_logits(
        None, none.reshape(-1), target[:, 0], torch.zeros(B + 1, dtype=torch.int64), 0,
        seed=torch.arange(B), verification=verification, **PARAMETERS, **given)[0]
    assert torch.equal(flat, out)


def test_compiled_with_every_part_of_step_0_equals_eager():
    target, draft, ids, counts, prompt = penalty_inputs()
    _, _, _, bias, _, mask = step_inputs()

    def call(target, draft, ids, bias, mask, counts, prompt):
        return specops.chain_speculative_sampling_from_logits(
            None, ids, target, draft_logits=draft, seed=torch.arange(B), logit_bias=bias,
            allowed_token_bitmask=mask, output_token_counts=counts, prompt_token_mask=prompt,
            draft_temperature=0.8, processing_order="transformers", **PARAMETERS,
            **PENALTIES)[:2]

    args = (target, draft, ids, bias, mask, counts, prompt)
    torch._dynamo.reset()
    compiled = torch.compile(call, backend="aot_eager", fullgraph=True)
    assert all(map(torch.equal, compiled(*args), call(*args)))


@pytest.mark.interpreter
def test_tree_triton_path_with_step_0_matches_reference():
    from specops.tree.launch import tree_speculative_sampling_from_logits_triton
    from specops.tree.reference import tree_speculative_sampling_from_logits_reference

    target, _, ids, bias, _, mask = step_inputs(seed=13, vocab=100)
    counts = (torch.arange(B * 100).reshape(B, 100) % 5 == 0).int()
    parents = torch.tensor([[0, 0, 1]] * B)  # node 3 under node 1, beside node 2
    args = (None, ids, parents, target, None, torch.arange(B), torch.zeros(1, dtype=torch.int64),
            torch.tensor([1.0, 0.0, 0.8, 1.2]), torch.tensor([0]), torch.tensor([1.0]),
            torch.tensor([0.05]), True, None, None, None, None, bias, mask,
            torch.tensor([1.3]), torch.tensor([0.4]), None, counts, None)
    on = [arg.to(DEVICE) if isinstance(arg, torch.Tensor) else arg for arg in args]
    expected = tree_speculative_sampling_from_logits_reference(*args)
    got = tree_speculative_sampling_from_logits_triton(*on)
    assert all(torch.equal(a.cpu(), b) for a, b in zip(got, expected))
