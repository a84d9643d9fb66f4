"""Rule step 0 inside the Triton kernels (core/sampling/step_triton.py): the grammar mask, the
logit bias and the penalties applied while the kernels read the target's logits must be exactly
the reference's adjusted rows (rule.adjusted_logits). Two checks, padded and flattened: every
row's statistics equal, field for field, those of the adjusted rows written out; and the token
and block kernels give, seed after seed, the tokens and counts they give the adjusted rows.
Interpreter on CPU, the same tests on CUDA."""

from __future__ import annotations

import pytest
import torch
from inputs import DEVICE, Allocations  # tests/inputs.py (conftest.py: TRITON_INTERPRET=1 on CPU)

from specops.chain.block.launch import block_speculative_sampling_from_logits_triton
from specops.chain.rows import Flattened
from specops.chain.token.launch import chain_speculative_sampling_from_logits_triton
from specops.core.logits.launch import row_statistics, step_arguments
from specops.core.logits.rule import Step, packed_bitmask

pytestmark = pytest.mark.interpreter

B, N, V = 4, 3, 100
LENGTHS = [2, 0, 3, 3]  # the flattened batch's drafts a request


def inputs(seed, parts=("bias", "mask", "penalties", "prompt"), bias_dtype=torch.float32):
    """(target logits (B, N + 1, V), draft logits (B, N, V), ids (B, N), Step): drafts that repeat
    (so that a row counts a token twice), an id outside [0, V) ending request 3's counted drafts,
    strong penalties (so that counting a draft more or less moves the row), request 2's penalty
    out of range (its rows without mass)."""
    g = torch.Generator().manual_seed(seed)
    target = 2 * torch.randn(B, N + 1, V, generator=g)
    draft = target[:, :N] + torch.randn(B, N, V, generator=g)
    top = target[:, :N].argmax(-1)  # drafts where the mass is, so that penalties matter
    ids = torch.where(torch.rand(B, N, generator=g) < 0.7, top,
                      torch.randint(0, V, (B, N), generator=g))
    ids[0, 1] = ids[0, 2] = ids[0, 0]
    ids[3, 1] = V + 5  # invalid: d_2 is not counted at row 3
    ids[3, 2] = ids[3, 0]
    step = Step()
    if "bias" in parts:
        bias = torch.randn(B, V, generator=g).to(bias_dtype)
        bias[:, :2] = -torch.inf
        step = step._replace(logit_bias=bias)
    if "mask" in parts:
        allowed = torch.rand(B, N + 1, V, generator=g) < 0.6
        allowed[..., 7] = True
        allowed[torch.arange(B)[:, None], torch.arange(N)[None, :], ids.clamp(max=V - 1)] = True
        step = step._replace(allowed_token_bitmask=packed_bitmask(allowed))
    if "penalties" in parts:
        counts = torch.randint(0, 3, (B, V), generator=g) * (torch.rand(B, V, generator=g) < 0.2)
        step = step._replace(repetition_penalty=torch.tensor([2.0, 1.5, -1.0, 3.0]),
                             frequency_penalty=torch.tensor([1.5]),
                             presence_penalty=torch.tensor([0.5, 2.0, 0.0, -0.5]),
                             output_token_counts=counts.int())
        if "prompt" in parts:
            step = step._replace(prompt_token_mask=torch.rand(B, V, generator=g) < 0.1)
    return target, draft, ids, step


def adjusted_target_logits(rows, ids, step, flat):
    """The target's rows after rule step 0, written out: padded (B, N + 1, V), row t counting
    the first t drafts; or a flattened batch's (T + B, V), each request's rows those of the
    padded batch it stands for (``requests_rows``, the logprobs op's rule)."""
    from specops.core.logits.rule import chain_generated
    from specops.core.logprobs.rule import requests_rows

    if flat is None:
        return step.adjusted(rows, lambda counts: chain_generated(counts, ids))
    batch = flat.cu_num_draft_tokens.shape[0] - 1
    tokens = torch.zeros(batch, flat.max_num_draft_tokens + 1, dtype=torch.int64,
                         device=rows.device)
    padded = requests_rows(rows, tokens, ids, flat.cu_num_draft_tokens, *step)
    return torch.cat([padded[b, :n + 1] for b, n in enumerate(LENGTHS)])


def to_device(step: Step) -> Step:
    return Step(*(None if t is None else t.to(DEVICE) for t in step))


def flattened(target, ids, step):
    """The same requests flattened (request b's first LENGTHS[b] drafts): (rows (T + B, V), ids
    (T,), its Step, Flattened)."""
    rows = torch.cat([target[b, :n + 1] for b, n in enumerate(LENGTHS)])
    flat_ids = torch.cat([ids[b, :n] for b, n in enumerate(LENGTHS)])
    mask = step.allowed_token_bitmask
    if mask is not None:
        mask = torch.cat([mask[b, :n + 1] for b, n in enumerate(LENGTHS)])
    cu = torch.tensor([0, *LENGTHS]).cumsum(0).to(DEVICE)
    return rows, flat_ids, step._replace(allowed_token_bitmask=mask), Flattened(cu, max(LENGTHS))


PARAMETERS = {  # temperature, top-k, top-p, min-p: every threshold the statistics find
    "temperature": (torch.tensor([1.0, 0.7, 1.0, 0.0]), 0, 1.0, 0.0),
    "top-k": (torch.tensor([1.0]), 5, 1.0, 0.0),
    "top-p and min-p": (torch.tensor([0.8]), 0, 0.8, 0.05),
}


def parameters(name):
    temperature, top_k, top_p, min_p = PARAMETERS[name]
    return (temperature.to(DEVICE), torch.tensor([top_k], device=DEVICE),
            torch.tensor([top_p], device=DEVICE), torch.tensor([min_p], device=DEVICE))


@pytest.mark.parametrize("name, layout", [("temperature", "padded"), ("temperature", "flattened"),
                                          ("top-k", "padded"), ("top-p and min-p", "flattened")])
def test_statistics_read_the_adjusted_rows(name, layout):
    target, _, ids, step = inputs(seed=1)
    if layout == "padded":
        rows, layout_ids, layout_step, flat = target, ids, step, None
        shape = None
    else:
        rows, layout_ids, layout_step, flat = flattened(target, ids, step)
        shape = (flat.cu_num_draft_tokens, flat.max_num_draft_tokens + 1, 1)
    rows, layout_ids, layout_step = rows.to(DEVICE), layout_ids.to(DEVICE), to_device(layout_step)
    adjusted = adjusted_target_logits(rows, layout_ids, layout_step, flat).contiguous()
    fused = row_statistics(rows, *parameters(name), shape,
                           step=step_arguments(layout_step, layout_ids, rows.device, N))
    written = row_statistics(adjusted, *parameters(name), shape)
    if flat is not None:  # laid out N + 1 a request, written for the request's rows only
        written_rows = torch.tensor([t <= n for n in LENGTHS for t in range(max(LENGTHS) + 1)])
        fused, written = fused[written_rows], written[written_rows]
    assert torch.equal(fused, written)
    assert (fused[:, 0] == 0).any() and (fused[:, 0] == 1).any()  # rows without mass, sampled


VERIFIERS = {"token": chain_speculative_sampling_from_logits_triton,
             "block": block_speculative_sampling_from_logits_triton}


ALL = ("bias", "mask", "penalties", "prompt")


@pytest.mark.parametrize("verification, layout, parts", [
    ("token", "padded", ALL), ("token", "flattened", ALL), ("block", "padded", ALL),
    ("block", "flattened", ALL), ("token", "padded", ("penalties",))])
def test_kernels_read_the_adjusted_rows(verification, layout, parts):
    """Seed after seed, the tokens and counts of the kernels applying step 0 as they read equal
    those of the same kernels reading the adjusted rows written out."""
    verify = VERIFIERS[verification]
    target, draft, ids, step = inputs(seed=2, parts=parts, bias_dtype=torch.bfloat16)
    if layout == "padded":
        rows, layout_ids, layout_step, flat = target, ids, step, None
        draft_rows = draft
    else:
        rows, layout_ids, layout_step, flat = flattened(target, ids, step)
        draft_rows = torch.cat([draft[b, :n] for b, n in enumerate(LENGTHS)])
    rows, layout_ids, layout_step = rows.to(DEVICE), layout_ids.to(DEVICE), to_device(layout_step)
    draft_rows = draft_rows.to(DEVICE)
    adjusted = adjusted_target_logits(rows, layout_ids, layout_step, flat)
    temperature = torch.tensor([1.0, 0.9, 1.0, 0.0], device=DEVICE)
    plain = (torch.zeros(1, dtype=torch.int64, device=DEVICE), torch.ones(1, device=DEVICE),
             torch.zeros(1, device=DEVICE))
    draft_parameters = (None,) * 4
    differs = 0
    for seed in range(2):
        results = []
        for logits, given in ((rows, layout_step), (adjusted, Step())):
            acc = torch.zeros(B, dtype=torch.int32, device=DEVICE)
            emit = torch.zeros(B, dtype=torch.int32, device=DEVICE)
            out = verify(None, layout_ids, logits, draft_rows, acc, emit,
                         torch.arange(B, device=DEVICE) + 10 * seed,
                         torch.zeros(1, dtype=torch.int64, device=DEVICE), temperature, *plain,
                         *draft_parameters, *given, "vllm", flattened=flat)
            results.append((out, acc, emit))
        (out_f, acc_f, emit_f), (out_w, acc_w, emit_w) = results
        assert torch.equal(out_f, out_w) and torch.equal(acc_f, acc_w)
        assert torch.equal(emit_f, emit_w)
        differs += not torch.equal(out_f, verify(
            None, layout_ids, rows, draft_rows, torch.zeros(B, dtype=torch.int32, device=DEVICE),
            torch.zeros(B, dtype=torch.int32, device=DEVICE),
            torch.arange(B, device=DEVICE) + 10 * seed,
            torch.zeros(1, dtype=torch.int64, device=DEVICE), temperature, *plain,
            flattened=flat))
    assert differs  # step 0 changed some tokens: the comparison above can fail


@pytest.mark.parametrize("verification", list(VERIFIERS))
@pytest.mark.parametrize("num_draft", [N, 20])  # 20: counted in a loop, not unrolled
@pytest.mark.parametrize("frequency", [-20.0, 20.0])  # a boost, a penalty
def test_the_rows_count_every_draft_before_them(verification, num_draft, frequency):
    """Drafts of one token X whose logit at row j is the runner-up Y's + 10 + j * frequency: X
    leads each row by 10 once the j drafts before it are counted, so every draft is accepted, and
    the bonus row's token is X. A row that counts one draft too few (under a boost) or too many
    (under a penalty) has X trailing Y by 10: a draft rejected for Y, or Y drawn at the bonus
    row."""
    x, y = 3, 8
    logits = torch.full((1, num_draft + 1, V), -30.0)
    logits[0, :, y] = 10.0
    logits[0, :, x] = 20.0 + frequency * torch.arange(num_draft + 1)  # row j: X counted j times
    ids = torch.full((1, num_draft), x, device=DEVICE)
    step = Step(frequency_penalty=torch.tensor([frequency], device=DEVICE),
                output_token_counts=torch.zeros(1, V, dtype=torch.int32, device=DEVICE))
    plain = (torch.ones(1, device=DEVICE), torch.zeros(1, dtype=torch.int64, device=DEVICE),
             torch.ones(1, device=DEVICE), torch.zeros(1, device=DEVICE))
    out = VERIFIERS[verification](
        None, ids, logits.to(DEVICE), None, torch.zeros(1, dtype=torch.int32, device=DEVICE),
        torch.zeros(1, dtype=torch.int32, device=DEVICE), torch.tensor([1], device=DEVICE),
        torch.zeros(1, dtype=torch.int64, device=DEVICE), *plain, *(None,) * 4, *step, "vllm")
    assert out.tolist() == [[x] * (num_draft + 1)]


def test_a_repetition_penalty_divides_exactly():
    """Rows whose largest logit is a generated token's positive logit x under a repetition
    penalty r: the largest logit the statistics find is x / r in float32, as the reference's
    (a division off by one unit in the last place, as a float32 reciprocal's product is in a
    third of cases, changes it; the tokens drawn would hardly ever show it)."""
    g = torch.Generator().manual_seed(3)
    batch, rows = 16, N + 1
    logits = torch.full((batch, rows, V), -1.0)
    logits[:, :, 5] = 1 + 63 * torch.rand(batch, rows, generator=g)
    counts = torch.zeros(batch, V, dtype=torch.int32)
    counts[:, 5] = 1
    repetition = 1 + 2 * torch.rand(batch, generator=g)
    step = to_device(Step(repetition_penalty=repetition, output_token_counts=counts))
    ids = torch.zeros(batch, N, dtype=torch.int64, device=DEVICE)
    plain = (torch.ones(1, device=DEVICE), torch.zeros(1, dtype=torch.int64, device=DEVICE),
             torch.ones(1, device=DEVICE), torch.zeros(1, device=DEVICE))
    stats = row_statistics(logits.to(DEVICE), *plain, step=step_arguments(step, ids, DEVICE))
    expected = (logits[:, :, 5] / repetition.float()[:, None]).reshape(-1)
    assert torch.equal(stats[:, 1].float().cpu(), expected)


def test_dividing_by_a_float64_reciprocal_rounds_as_float32_division():
    """step_triton.py divides a positive logit x by the repetition penalty r as x * RN(1 / r) in
    float64 rounded to float32, which must be x / r in float32 wherever the quotient is normal
    (the argument, and the subnormal exception, in docs/internals/kernel.md): positive float32 bit
    patterns over the whole range, and r near 1."""
    g = torch.Generator().manual_seed(0)
    for r_low, r_high in ((0x00000001, 0x7F800000), (0x3F000000, 0x40000000)):
        x = torch.randint(0x00000001, 0x7F800000, (2_000_000,), generator=g, dtype=torch.int32)
        r = torch.randint(r_low, r_high, (2_000_000,), generator=g, dtype=torch.int32)
        x, r = x.view(torch.float32), r.view(torch.float32)
        product = (x.double() * (1.0 / r.double())).float()
        assert torch.equal((x / r).view(torch.int32), product.view(torch.int32))


@pytest.mark.parametrize("verification", ["token", "traversal"])
def test_a_trees_kernels_apply_step_0_as_they_read(monkeypatch, verification):
    """Seed after seed, a tree's kernel from logits (token and traversal verification), rule step
    0 applied as the statistics and the kernel read the target's logits, gives the tokens and
    nodes it gives the adjusted rows written out, each node's path counted as generated (a token
    thrice on one path, an id outside [0, V) that is not counted, penalties strong enough that
    one count more or less moves the rows, a greedy request); and no row-sized tensor is made:
    neither adjusted nor processed rows, nor counts per node."""
    from specops.tree.launch import tree_speculative_sampling_from_logits_triton as verify
    from specops.tree.processed import tree_generated

    m = 6
    g = torch.Generator().manual_seed(4)
    target = 2 * torch.randn(B, m + 1, V, generator=g)
    draft = target + torch.randn(B, m + 1, V, generator=g)
    parents = torch.tensor([[0, 1, 2, 1, 0, 3]] * B)  # 1-2-3-6 a path; 4 under 2; 5 at the root
    ids = target[:, :m].argmax(-1)  # where the mass is: children of the row they are judged in
    ids[:, 1] = ids[:, 2] = ids[:, 0]  # the path 1-2-3 carries one token thrice
    ids[:, 5] = ids[:, 0]
    ids[3, 1] = V + 5  # node 2's own token: not counted at it or below it
    ids[1, 3] = -1
    allowed = torch.rand(B, m + 1, V, generator=g) < 0.6
    allowed[..., 7] = True
    allowed[torch.arange(B)[:, None], torch.arange(m)[None, :], ids.clamp(0, V - 1)] = True
    step = Step(logit_bias=torch.randn(B, V, generator=g),
                allowed_token_bitmask=packed_bitmask(allowed),
                repetition_penalty=torch.tensor([2.0, 1.5, -1.0, 3.0]),
                frequency_penalty=torch.tensor([1.5]),
                presence_penalty=torch.tensor([0.5, 2.0, 0.0, -0.5]),
                output_token_counts=(torch.rand(B, V, generator=g) < 0.2).int(),
                prompt_token_mask=torch.rand(B, V, generator=g) < 0.1)
    target, draft, ids, parents, step = (target.to(DEVICE), draft.to(DEVICE), ids.to(DEVICE),
                                         parents.to(DEVICE), to_device(step))
    unpenalised = step._replace(repetition_penalty=None, frequency_penalty=None,
                                presence_penalty=None)  # the bias and the mask: no paths
    offset = torch.zeros(1, dtype=torch.int64, device=DEVICE)

    def call(logits, given, seed):
        return verify(None, ids, parents, logits, draft, torch.arange(B, device=DEVICE) + seed,
                      offset, *parameters("temperature"), True, *(None,) * 4, *given, "vllm",
                      verification)

    seeds = (0, 10)
    written = {given: [call(given.adjusted(target, lambda counts: tree_generated(
        counts, ids, parents)), Step(), seed) for seed in seeds] for given in (step, unpenalised)}
    plain = [call(target, Step(), seed) for seed in seeds]
    from specops.core.logits import rule

    def refused(*args):
        raise AssertionError("step 0 applied by torch, its adjusted rows written")

    monkeypatch.setattr(rule, "adjusted_logits", refused)
    for given, expected in written.items():
        for seed, outputs in zip(seeds, expected):
            with Allocations() as allocations:
                got = call(target, given, seed)
            assert all(map(torch.equal, got, outputs))
            assert not [shape for shape, dtype in allocations.made if shape[-1:] == (V,)]
    assert any(not torch.equal(a[0], b[0]) for a, b in zip(written[step], plain))  # can fail
    assert any(not torch.equal(a[0], b[0]) for a, b in zip(written[step], written[unpenalised]))
    # No requests, with penalties: the paths of none.
    none = Step(repetition_penalty=torch.tensor([2.0], device=DEVICE),
                output_token_counts=step.output_token_counts[:0])
    empty = verify(None, ids[:0], parents[:0], target[:0], draft[:0], offset, offset,
                   torch.ones(1, device=DEVICE), *parameters("top-k")[1:], True, *(None,) * 4,
                   *none, "vllm", verification)
    assert [tuple(t.shape) for t in empty] == [(0, m + 1), (0, m), (0,)]


@pytest.mark.parametrize("shape", ["chain", "random"])
def test_a_trees_paths_count_what_each_row_counts(shape):
    """``paths``' lists, read as the kernels read them (row t: at most t ids, up to the first
    outside [0, V)), count for every row what ``tree_generated`` counts: deep chains (every
    ancestor found), random trees with ids and parents out of range (an unlinked node's own token
    not counted, its descendants' counted)."""
    from specops.tree.processed import paths
    from specops.tree.processed import tree_generated

    g = torch.Generator().manual_seed(6)
    batch, m = 3, 37
    ids = torch.randint(-2, V + 2, (batch, m), generator=g)
    if shape == "chain":
        parents = torch.arange(m).expand(batch, m)
    else:
        parents = torch.stack([torch.randint(-1, i + 2, (batch,), generator=g)
                               for i in range(m)], dim=1)
    counts = torch.randint(0, 3, (batch, V), generator=g)
    lists = paths(ids, parents, V)
    t = torch.arange(m + 1)[None, :, None]
    k = torch.arange(lists.shape[-1])[None, None, :]
    read = ((lists >= 0) & (lists < V)).int().cumprod(dim=-1).bool() & (k < t)
    counted = counts.long()[:, None, :].repeat(1, m + 1, 1).scatter_add(
        2, lists.clamp(0, V - 1), read.long())
    assert torch.equal(counted, tree_generated(counts, ids, parents))


def test_step_0_at_a_few_tokens_counts_each_rows_list():
    """``rule.adjusted_at`` (rule step 0 at K tokens a row, each row's generated ids a list) gives
    the adjusted rows' values at the tokens: lists with repeats, ids outside [0, V) ending a list,
    rows counting their first p ids. Its count takes memory of the lists' and tokens' size, not
    K * L a row (a tree of M nodes passes its M children a row and M-long paths)."""
    from specops.core.logits.rule import adjusted_at, adjusted_logits, listed_generated

    g = torch.Generator().manual_seed(11)
    batch, positions, k, length = 2, 40, 39, 39
    x = torch.randn(batch, positions, V, generator=g)
    ids = torch.randint(0, V, (batch, positions, k), generator=g)
    lists = torch.randint(0, 12, (batch, positions, length), generator=g)  # with repeats
    lists[0, :, 30] = V  # an id outside [0, V) ends request 0's lists
    counts = torch.randint(0, 3, (batch, V), generator=g)
    step = Step(repetition_penalty=torch.tensor([1.3]),
                frequency_penalty=torch.tensor([0.2, 0.5]), presence_penalty=torch.tensor([0.1]),
                output_token_counts=counts,
                prompt_token_mask=torch.rand(batch, V, generator=g) < 0.3)
    dense = adjusted_logits(x, penalties=step.penalties(),
                            generated=listed_generated(counts, lists))
    with Allocations() as seen:
        got = adjusted_at(x.gather(-1, ids), ids, V, step, lists=lists)
    assert torch.equal(got, dense.gather(-1, ids))
    largest = max(torch.Size(shape).numel() for shape, _ in seen.made)
    assert largest <= batch * positions * max(k, length), largest


@pytest.mark.parametrize("layout", ["chain", "tree", "flattened"])
def test_logprobs_apply_step_0_as_they_read(monkeypatch, layout):
    """The logprobs op's Triton path (and each row's entropy) with rule step 0 (each row's drafts or
    path counted as generated; a flattened batch read where its rows are) gives, bit for bit, what
    it gives the adjusted rows written out, and the reference's values to float32 rounding; without
    top tokens it makes no row-sized tensor."""
    from specops.core.logprobs.launch import token_logprobs_triton
    from specops.core.logprobs.rule import requests_rows, token_logprobs_reference
    from specops.core.sampling.flattened import Padded
    from specops.tree.processed import paths

    target, _, ids, step = inputs(seed=6)
    g = torch.Generator().manual_seed(6)
    tokens = torch.randint(0, V, (B, N + 1), generator=g)
    tokens[:, :N] = torch.where(torch.rand(B, N, generator=g) < 0.5, ids.clamp(0, V - 1),
                                tokens[:, :N])  # drafts, where penalties move the rows
    tokens[0, 1], tokens[2, 3] = -1, V + 3  # no token
    params = parameters("temperature")  # a greedy request too
    if layout == "flattened":
        rows, flat_ids, flat_step, flat = flattened(target, ids, step)
        lists, cu = flat_ids.to(DEVICE), flat.cu_num_draft_tokens
        given, logits = to_device(flat_step), rows.to(DEVICE)
        tokens = tokens[:, :max(LENGTHS) + 1]
    else:
        if layout == "chain":
            lists = ids[:, None, :].expand(B, N + 1, N)
        else:  # a tree: 1-2 a path, 3 under the root
            lists = paths(ids, torch.tensor([[0, 1, 0]] * B), V)
        lists, cu, given, logits = lists.to(DEVICE), None, to_device(step), target.to(DEVICE)
    tokens = tokens.to(DEVICE)
    adjusted = requests_rows(logits, tokens, lists, cu, *given).contiguous()
    for num_top in (0, 3):
        fused = token_logprobs_triton(logits, tokens, *params, num_top, "vllm", True, lists, cu,
                                      *given)
        written = token_logprobs_triton(adjusted, tokens, *params, num_top, "vllm", True)
        assert all(map(torch.equal, fused, written))
        reference = token_logprobs_reference(logits, tokens, *params, num_top, "vllm", True,
                                             lists, cu, *given)
        torch.testing.assert_close(fused[0], reference[0], rtol=0, atol=2e-6)
        assert torch.equal(fused[1], reference[1])
        torch.testing.assert_close(fused[3], reference[3], rtol=0, atol=1e-5)
    plain = token_logprobs_triton(logits if cu is None else Padded(
        cu, lists.shape[0], tokens.shape[1] - 1).targets(logits), tokens, *params)[0]
    assert not torch.equal(fused[0], plain)  # step 0 moved the logprobs: this test can fail
    from specops.core.logits import rule

    def refused(*args):
        raise AssertionError("step 0 applied by torch, its adjusted rows written")

    monkeypatch.setattr(rule, "adjusted_logits", refused)
    with Allocations() as allocations:
        fused = token_logprobs_triton(logits, tokens, *params, 0, "vllm", True, lists, cu,
                                      *given)
    assert torch.equal(fused[0], written[0]) and torch.equal(fused[3], written[3])
    assert not [shape for shape, dtype in allocations.made if shape[-1:] == (V,)]
