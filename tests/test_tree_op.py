"""The tree op (docs/tree.md, "Tree verification") and ``specops.tree_speculative_sampling``:
registration (opcheck, schema), torch.compile, the CPU backend against the reference, chains
against the chain op, absent nodes, duplicates, seeds and batch invariance, fixed-seed outputs."""

from __future__ import annotations

import expecttest
import pytest
import torch

import specops
from specops.chain.token.reference import chain_speculative_sampling_reference
from specops.tree import cpu, reference
from specops.tree.op import SCHEMA

from inputs import full_tree, tree_inputs  # tests/inputs.py

OP = torch.ops.specops.tree_speculative_sampling
SEED, OFFSET = torch.tensor([17]), torch.tensor([2])


def call(draft, ids, parents, target, seed=SEED, offset=OFFSET, with_replacement=True):
    return OP(draft, ids, parents, target, seed, offset, with_replacement)


def same(a, b) -> bool:
    return all(torch.equal(x, y) for x, y in zip(a, b))


# ----------------------------------------------------------------------------------------------
# Registration


OPCHECK_CONFIGS = [
    # (draft given, with_replacement, prob dtype, ids dtype, parents dtype, per-request seeds)
    (True, True, torch.float32, torch.int64, torch.int64, False),
    (True, False, torch.float32, torch.int32, torch.int64, True),
    (False, True, torch.float32, torch.int64, torch.int32, False),
    (True, True, torch.float16, torch.int32, torch.int32, True),
    (True, False, torch.bfloat16, torch.int64, torch.int32, False),
    (False, False, torch.bfloat16, torch.int32, torch.int64, True),
]


@pytest.mark.parametrize("draft,replacement,dtype,ids_dtype,parents_dtype,per_request",
                         OPCHECK_CONFIGS)
def test_opcheck(draft, replacement, dtype, ids_dtype, parents_dtype, per_request):
    batch = 5
    q, d, par, p = tree_inputs(batch, 7, 40, dtype=dtype, draft=draft, ids_dtype=ids_dtype,
                               parents_dtype=parents_dtype, device="cpu")
    d[1, 2] = -1  # an absent node (and its subtree), an id >= V, a malformed parent
    d[2, 0] = 40
    par[3, 4] = 6
    seed = torch.arange(batch) * 1000 - 3 if per_request else torch.tensor([17])
    offset = torch.arange(batch) if per_request else torch.tensor([2])
    torch.library.opcheck(OP, (q, d, par, p, seed, offset, replacement))


def test_opcheck_empty_batch():
    q, d, par, p = tree_inputs(0, 3, 8, device="cpu")
    torch.library.opcheck(OP, (q, d, par, p, SEED, OFFSET, True))
    tokens, nodes, emitted = specops.tree_speculative_sampling(q, d, par, p, seed=1)
    assert tokens.shape == (0, 4) and nodes.shape == (0, 3) and emitted.shape == (0,)


class TestExpected(expecttest.TestCase):
    def test_schema(self):
        self.assertExpectedInline(
            str(OP.default._schema),
            """specops::tree_speculative_sampling(Tensor? draft_probs, Tensor draft_token_ids, Tensor parents, Tensor target_probs, Tensor seed, Tensor offset, bool with_replacement=True, str verification="token") -> (Tensor, Tensor, Tensor)""",
        )
        assert SCHEMA.lstrip("(").split(") ->")[0] in str(OP.default._schema)

    def test_fixed_seed_output(self):
        # Pinned tokens: a change to the slot layout or the rules changes them, and must then be a
        # deliberate, documented change (the kernel tests hold the kernel to the reference).
        # torch.rand's stream and exact float32 products only: the same inputs in every release
        # (rows are used as given, so they need no normalising).
        g = torch.Generator().manual_seed(5)
        p = torch.rand(2, 7, 12, generator=g) ** 2
        q = torch.rand(2, 7, 12, generator=g) ** 2
        parents = full_tree(2, 2).expand(2, 6)
        ids = torch.tensor([[3, 5, 3, 0, 7, 1], [2, 2, 9, 4, 1, 1]])
        lines = []
        for draft, replacement in ((q, True), (q, False), (None, True)):
            out = call(draft, ids, parents, p, torch.tensor([2024]), torch.tensor([18]),
                       replacement)
            lines += [str(t.tolist()) for t in out]
        self.assertExpectedInline("\n".join(lines), """\
[[3, 3, 3, -1, -1, -1, -1], [0, -1, -1, -1, -1, -1, -1]]
[[1, 3, -1, -1, -1, -1], [-1, -1, -1, -1, -1, -1]]
[2, 0]
[[3, 3, 3, -1, -1, -1, -1], [0, -1, -1, -1, -1, -1, -1]]
[[1, 3, -1, -1, -1, -1], [-1, -1, -1, -1, -1, -1]]
[2, 0]
[[3, 4, -1, -1, -1, -1, -1], [0, -1, -1, -1, -1, -1, -1]]
[[1, -1, -1, -1, -1, -1], [-1, -1, -1, -1, -1, -1]]
[1, 0]""")


def test_output_format():
    """Tokens: the path's tokens, the drawn token, then -1; nodes: the path, a chain of parents
    from the root; emitted: its length."""
    q, d, par, p = tree_inputs(64, 14, 30, device="cpu", seed=3)
    for draft, replacement in ((q, True), (q, False), (None, True)):
        tokens, nodes, emitted = call(draft, d, par, p, with_replacement=replacement)
        assert tokens.dtype == nodes.dtype == emitted.dtype == torch.int32
        for b in range(64):
            e = int(emitted[b])
            path = nodes[b, :e].long()
            assert (nodes[b, e:] == -1).all() and (tokens[b, e + 1:] == -1).all()
            assert 0 <= int(tokens[b, e]) < 30
            assert torch.equal(tokens[b, :e].long(), d[b, path - 1])
            above = torch.cat([torch.zeros(1, dtype=torch.long), path])[:e]  # root, then path
            assert torch.equal(par[b, path - 1], above)


# ----------------------------------------------------------------------------------------------
# Backends


@pytest.mark.parametrize("draft,replacement,dtype", [
    (True, True, torch.float32), (True, False, torch.float16), (False, True, torch.bfloat16)])
def test_cpu_backend_matches_reference(draft, replacement, dtype):
    """The CPU backend forms only the rows a step needs, and gives the reference's tokens, with
    dirty rows too (NaN, negative, rows without mass)."""
    q, d, par, p = tree_inputs(40, 12, 2100, dtype=dtype, draft=draft, seed=4, device="cpu")
    p[0, 0, :5] = float("nan")
    p[1, 0] = 0.0
    p[2, :, 7] = -1.0
    if q is not None:
        q[3, 0, 9] = float("inf")
        q[4, 0] = p[4, 0]  # identical rows: the first residual has no mass
    d[5, :4] = -1
    seed, offset = torch.arange(40) * 7 - 100, torch.tensor([9])
    expected = reference.tree_speculative_sampling_reference(q, d, par, p, seed, offset,
                                                             replacement)
    assert same(cpu.tree_speculative_sampling_cpu(q, d, par, p, seed, offset, replacement),
                expected)
    assert same(call(q, d, par, p, seed, offset, replacement), expected)  # the op's CPU backend


def test_reference_runs_on_the_meta_device():
    # No host read of data anywhere in the reference: it would raise on meta tensors.
    q, d, par, p = tree_inputs(3, 5, 2100, device="cpu")
    args = [t.to("meta") for t in (q, d, par, p, SEED, OFFSET)]
    for draft in (args[0], None):
        out = reference.tree_speculative_sampling_reference(draft, *args[1:], False)
        assert [o.shape for o in out] == [(3, 6), (3, 5), (3,)]


# ----------------------------------------------------------------------------------------------
# The public function


def test_public_function_is_the_op():
    q, d, par, p = tree_inputs(6, 9, 50, device="cpu", seed=1)
    seeds = torch.tensor([3, -4, 5, 6, 7, 8])
    for draft, replacement in ((q, True), (q, False), (None, False)):
        out = specops.tree_speculative_sampling(draft, d, par, p, seed=seeds, offset=4,
                                                with_replacement=replacement)
        assert same(out, call(draft, d, par, p, seeds, torch.tensor([4]), replacement))


def test_seeds_offsets_and_generators():
    q, d, par, p = tree_inputs(200, 6, 20, device="cpu", seed=2)
    first = specops.tree_speculative_sampling(q, d, par, p, seed=1)
    assert same(first, specops.tree_speculative_sampling(q, d, par, p, seed=1, offset=0))
    assert not same(first, specops.tree_speculative_sampling(q, d, par, p, seed=1, offset=1))
    torch.manual_seed(0)
    drawn = specops.tree_speculative_sampling(q, d, par, p)
    torch.manual_seed(0)
    assert same(drawn, specops.tree_speculative_sampling(q, d, par, p))
    g = torch.Generator().manual_seed(3)
    a = specops.tree_speculative_sampling(None, d, par, p, generator=g)
    g.manual_seed(3)
    assert same(a, specops.tree_speculative_sampling(None, d, par, p, generator=g))


def test_batch_invariance_with_per_request_seeds():
    q, d, par, p = tree_inputs(8, 10, 1500, device="cpu", seed=6)
    seeds, offsets = torch.arange(8) * 31 + 1, torch.arange(8)
    for draft in (q, None):
        whole = specops.tree_speculative_sampling(draft, d, par, p, seed=seeds, offset=offsets)
        alone = specops.tree_speculative_sampling(
            None if draft is None else draft[5:6], d[5:6], par[5:6], p[5:6], seed=seeds[5:6],
            offset=offsets[5:6])
        assert same([o[5:6] for o in whole], alone)


def _op_fn(q, d, par, p, seed, offset):
    return OP(q, d, par, p, seed, offset, False)


def _wrapper_fn(q, d, par, p):
    return specops.tree_speculative_sampling(q, d, par, p, seed=1234, offset=9)


def _target_only_fn(d, par, p, seed):
    return specops.tree_speculative_sampling(None, d, par, p, seed=seed)


@pytest.mark.parametrize("backend", ["aot_eager", "inductor"])
def test_compile_matches_eager(backend):
    torch._dynamo.reset()
    q, d, par, p = tree_inputs(6, 6, 1500, device="cpu", seed=3)
    d[0, 1] = -1
    seeds, offsets = torch.tensor([3, -4, 5, 6, 7, 8]), torch.tensor([11])
    compiled = torch.compile(_op_fn, fullgraph=True, backend=backend)
    assert same(compiled(q, d, par, p, seeds, offsets), _op_fn(q, d, par, p, seeds, offsets))
    wrapped = torch.compile(_wrapper_fn, fullgraph=True, backend=backend)
    assert same(wrapped(q, d, par, p), _wrapper_fn(q, d, par, p))
    target_only = torch.compile(_target_only_fn, fullgraph=True, backend=backend)
    assert same(target_only(d, par, p, seeds), _target_only_fn(d, par, p, seeds))


# ----------------------------------------------------------------------------------------------
# The rules


@pytest.mark.parametrize("replacement", [True, False])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
def test_a_chain_gives_the_chain_ops_tokens(replacement, dtype):
    """parents[i] = i with draft probabilities: the rules and the slots coincide with the chain
    op's, so the tokens do, token for token (target-only, only the distributions coincide:
    tests/test_tree_statistics.py)."""
    batch, num_draft, vocab = 300, 5, 2100
    q, d, par, p = tree_inputs(batch, num_draft, vocab, dtype=dtype, parents=torch.arange(5),
                               device="cpu", seed=8, sharp=1.0)
    d[torch.rand(d.shape, generator=torch.Generator().manual_seed(1)) < 0.05] = -1
    q[7, 2] = p[7, 2]  # a residual without mass: p's token
    seeds = torch.randint(-2**63, 2**63 - 1, (batch,), generator=torch.Generator().manual_seed(2))
    acc, emit = torch.zeros(batch, dtype=torch.int32), torch.zeros(batch, dtype=torch.int32)
    chain = chain_speculative_sampling_reference(q[:, :num_draft], d, p, acc, emit, seeds, OFFSET)
    tokens, nodes, emitted = call(q, d, par, p, seeds, OFFSET, replacement)
    assert torch.equal(tokens, chain) and torch.equal(emitted, emit)
    assert 0 < float(emitted.float().mean()) < num_draft  # both accepts and rejections


def test_absent_nodes_never_change_an_output():
    """Absent nodes (id -1 or >= V, a parent out of range, or an absent parent) and their
    subtrees: whatever their rows, the tokens below them and (absent by their id) their parents,
    the outputs do not move."""
    num_nodes, vocab = 12, 30
    q, d, par, p = tree_inputs(50, num_nodes, vocab, device="cpu", seed=9)
    d[:, 3] = -1  # node 4 absent, and every node below it
    d[:, 7] = vocab
    par[:, 9] = 11  # malformed: a parent after the node (one that a walk reaches)
    # Computed here, not by the code under test: not linked (an id outside [0, V) or a parent
    # outside [0, i]), and below (not linked, or under a node that is not).
    no_token = (d < 0) | (d >= vocab)
    absent = no_token | (par < 0) | (par > torch.arange(num_nodes))
    below = absent.clone()
    for i in range(num_nodes):
        parent = par[:, i]
        under = below.gather(1, (parent - 1).clamp(0, num_nodes - 1)[:, None]).squeeze(1)
        below[:, i] |= (parent > 0) & under
    g = torch.Generator().manual_seed(4)
    d2, par2, p2, q2 = d.clone(), par.clone(), p.clone(), q.clone()
    tokens_below = below & ~no_token
    d2[tokens_below] = torch.randint(0, vocab, (int(tokens_below.sum()),), generator=g)
    # Any parent for a node absent by its id (a malformed node's parent would link it).
    par2[no_token] = torch.randint(-5, 20, (int(no_token.sum()),), generator=g)
    rows = torch.nn.functional.pad(below, (1, 0))  # (B, M + 1): the rows of those nodes
    p2[rows] = float("nan")
    q2[rows] = -1.0
    for draft, draft2, replacement in ((q, q2, True), (q, q2, False), (None, None, True)):
        before = call(draft, d, par, p, with_replacement=replacement)
        assert same(call(draft2, d2, par2, p2, with_replacement=replacement), before)
        assert not (before[1] == 4).any()


def test_leaf_draft_rows_are_not_read():
    q, d, par, p = tree_inputs(30, 6, 40, parents=full_tree(2, 2), device="cpu", seed=10)
    before = call(q, d, par, p)
    q2 = q.clone()
    q2[:, 3:] = float("nan")  # nodes 3..6 are leaves
    assert same(call(q2, d, par, p), before)


def test_duplicate_siblings():
    """The first child carrying a token is the one taken; a later sibling with that token is never
    accepted (whatever its rows)."""
    vocab = 6
    parents = torch.tensor([[0, 0, 1, 2]])
    d = torch.tensor([[2, 2, 4, 5]])
    p = torch.zeros(1, 5, vocab)
    p[:, 0, 2] = 1.0  # the root's target puts everything on token 2
    p[:, 1:] = 1.0 / vocab
    q = torch.full((1, 5, vocab), 1.0 / vocab)
    for draft in (q, None):
        for seed in range(20):
            tokens, nodes, _ = call(draft, d, parents, p, torch.tensor([seed]), OFFSET)
            assert int(nodes[0, 0]) == 1 and int(tokens[0, 0]) == 2
    # The first child rejected (p(2) = 0 at the root): its duplicate is rejected too, even where
    # the residual would round to accept it.
    p[:, 0] = 0.0
    p[:, 0, 3] = 1.0
    for seed in range(20):
        tokens, nodes, emitted = call(q, d, parents, p, torch.tensor([seed]), OFFSET)
        assert int(emitted[0]) == 0 and int(tokens[0, 0]) == 3


def test_bonus_token_at_a_leaf_and_no_mass():
    d = torch.tensor([[1, 2]])
    parents = torch.tensor([[0, 1]])
    p = torch.zeros(1, 3, 4)
    p[0, 0, 1] = p[0, 1, 2] = 1.0  # the path 1, 2 is certain
    p[0, 2, 3] = 1.0
    q = p.clone()
    for draft in (q, None):
        tokens, nodes, emitted = call(draft, d, parents, p)
        assert tokens.tolist() == [[1, 2, 3]] and nodes.tolist() == [[1, 2]]
        p2 = p.clone()
        p2[0, 2] = 0.0  # the leaf's row has no mass: no token
        tokens, _, emitted = call(draft, d, parents, p2)
        assert tokens.tolist() == [[1, 2, -1]] and emitted.tolist() == [2]
