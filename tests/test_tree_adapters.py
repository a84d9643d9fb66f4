"""SGLang's tree layout (first child / next sibling) turned into the tree op's parents
(specops/tree/adapters.py), on lists built the way SGLang's tree builder builds them and the other
way round, and on EAGLE-style top-k trees verified end to end; bad arguments named, eagerly, under
SPECOPS_VALIDATE=1 and under torch.compile."""

from __future__ import annotations

import pytest
import torch

import specops
from specops.tree.adapters import from_sglang
from specops.tree.arguments import present_nodes

from inputs import full_tree
from tracing import errors_while_tracing  # tests/


def random_parents(num_nodes: int, generator) -> torch.Tensor:
    """A parent for node i + 1 uniform in [0, i]."""
    return torch.tensor([int(torch.randint(0, i + 1, (1,), generator=generator))
                         for i in range(num_nodes)])


def sglang_lists(parents: torch.Tensor, prepend: bool = True):
    """(retrive_next_token, retrive_next_sibling) (M + 1,) of one tree. prepend: as SGLang's
    builder does, each node linked in front of its parent's list, from the last node to the
    first; else each node appended behind its parent's list, from the first node on. Both make
    lists in node order."""
    width = parents.shape[0] + 1
    first = torch.full((width,), -1, dtype=torch.int64)
    sibling = torch.full((width,), -1, dtype=torch.int64)
    if prepend:
        for node in range(width - 1, 0, -1):
            parent = int(parents[node - 1])
            sibling[node] = first[parent]
            first[parent] = node
    else:
        last = {}
        for node in range(1, width):
            parent = int(parents[node - 1])
            if parent in last:
                sibling[last[parent]] = node
            else:
                first[parent] = node
            last[parent] = node
    return first, sibling


@pytest.mark.parametrize("prepend", [True, False])
def test_parents_back_from_either_way_of_building_the_lists(prepend):
    g = torch.Generator().manual_seed(0)
    trees = [random_parents(m, g) for m in (1, 5, 12, 30) for _ in range(3)]
    trees += [full_tree(2, 3), full_tree(3, 2), torch.arange(7)]  # full trees, a chain
    for parents in trees:
        first, sibling = sglang_lists(parents, prepend)
        width = parents.shape[0] + 1
        candidates = torch.randint(0, 100, (1, width), generator=g)
        ids, got = from_sglang(candidates, first[None], sibling[None])
        assert torch.equal(got[0], parents) and torch.equal(ids, candidates[:, 1:])


def test_a_batch_of_different_trees_and_unreachable_nodes():
    g = torch.Generator().manual_seed(1)
    trees = [random_parents(9, g) for _ in range(5)]
    lists = [sglang_lists(t) for t in trees]
    first = torch.stack([f for f, _ in lists])
    sibling = torch.stack([s for _, s in lists])
    candidates = torch.arange(50).reshape(5, 10).int()
    # Request 2: node 4 dropped from its parent's list (SGLang skips a token whose parent was not
    # selected): it and every node below it are unreachable.
    parent4 = int(trees[2][3])
    if first[2, parent4] == 4:
        first[2, parent4] = sibling[2, 4]
    else:
        before = (sibling[2] == 4).nonzero()[0]
        sibling[2, before] = sibling[2, 4]
    ids, parents = from_sglang(candidates, first, sibling)
    assert ids.dtype == torch.int32 and parents.dtype == torch.int64
    for b in (0, 1, 3, 4):
        assert torch.equal(parents[b], trees[b]) and torch.equal(ids[b], candidates[b, 1:])
    # Node 4 gets no parent and no token; the nodes below it keep theirs (node 4's list still
    # reaches them), and the op sees them absent, their parent being absent.
    assert parents[2, 3] == -1 and ids[2, 3] == -1
    below = {4}
    for node in range(5, 10):
        if int(trees[2][node - 1]) in below:
            below.add(node)
        else:
            assert parents[2, node - 1] == trees[2][node - 1]
    present = present_nodes(ids, parents, 100)[2]
    assert not any(bool(present[node]) for node in below)
    assert all(bool(present[node]) for node in range(10) if node not in below)


def test_eagle_top_k_tree_verified_from_sglang_lists():
    """An EAGLE-style tree (each node's top-k draft tokens), handed over in SGLang's layout,
    verified target-only: the same outputs as from the parents it was built from."""
    vocab, parents = 50, full_tree(3, 2)
    g = torch.Generator().manual_seed(2)
    draft = torch.softmax(torch.randn(4, 13, vocab, generator=g) * 2, -1)
    target = torch.softmax(torch.randn(4, 13, vocab, generator=g) * 2, -1)
    ids = torch.zeros(4, 12, dtype=torch.int64)
    for node in range(13):
        kids = (parents == node).nonzero().squeeze(1)
        if kids.numel():
            ids[:, kids] = draft[:, node].topk(kids.numel()).indices
    first, sibling = sglang_lists(parents)
    candidates = torch.cat([torch.zeros(4, 1, dtype=torch.int64), ids], 1)
    got_ids, got_parents = from_sglang(candidates, first.expand(4, -1), sibling.expand(4, -1))
    expected = specops.tree_speculative_sampling(None, ids, parents.expand(4, -1), target, seed=3)
    out = specops.tree_speculative_sampling(None, got_ids, got_parents, target, seed=3)
    assert all(torch.equal(a, b) for a, b in zip(out, expected))


def two_trees():
    """(candidates, retrive_next_token, retrive_next_sibling) of two trees of M = 4 nodes."""
    lists = [sglang_lists(torch.tensor(t)) for t in ([0, 0, 1, 1], [0, 1, 2, 0])]
    return (torch.arange(10).reshape(2, 5), torch.stack([f for f, _ in lists]),
            torch.stack([s for _, s in lists]))


NAMES = ["candidates", "retrive_next_token", "retrive_next_sibling"]
MATCH = "to match candidates (2, 5)"

# (argument, its replacement, exception type, fragments the message must contain)
BAD = [
    ("candidates", [[0, 1, 2, 3, 4]] * 2, TypeError, ["must be a tensor", "list"]),
    ("retrive_next_token", None, TypeError, ["must be a tensor", "NoneType"]),
    ("retrive_next_sibling", 3, TypeError, ["must be a tensor", "int"]),
    ("candidates", torch.arange(5), ValueError, ["(batch_size, num_nodes + 1)", "1-D", "(5,)"]),
    ("candidates", torch.zeros(2, 5), TypeError, ["dtype int32 or int64", "float32"]),
    ("retrive_next_token", torch.zeros(2, 4, dtype=torch.int64), ValueError,
     ["must have shape (batch_size, num_nodes + 1) = (2, 5)", MATCH, "got (2, 4)"]),
    ("retrive_next_sibling", torch.zeros(10, dtype=torch.int64), ValueError, [MATCH, "got (10,)"]),
    ("retrive_next_token", torch.zeros(2, 5, dtype=torch.int16), TypeError,
     ["dtype int32 or int64", "int16"]),
    ("retrive_next_sibling", torch.zeros(2, 5), TypeError, ["dtype int32 or int64", "float32"]),
    ("retrive_next_token", torch.zeros(2, 5, dtype=torch.int64, device="meta"), ValueError,
     ["same device as candidates (cpu)", "got meta"]),
    ("retrive_next_sibling", torch.zeros(2, 5, dtype=torch.int32, device="meta"), ValueError,
     ["same device as candidates (cpu)", "got meta"]),
]


@pytest.mark.parametrize("name,value,exc,fragments", BAD)
def test_bad_arguments_raise_naming_the_argument(name, value, exc, fragments):
    args = dict(zip(NAMES, two_trees()))
    args[name] = value
    with pytest.raises(exc) as info:
        from_sglang(*args.values())
    message = str(info.value)
    assert message.startswith(name + " must"), message
    assert all(f in message for f in fragments), message


def test_a_tree_without_a_root_is_refused():
    empty = torch.zeros(2, 0, dtype=torch.int64)
    with pytest.raises(ValueError, match=r"^candidates must have num_nodes \+ 1 >= 1 columns"):
        from_sglang(empty, empty, empty)


def test_int32_and_int64_give_the_same_trees():
    candidates, first, sibling = two_trees()
    ids, parents = from_sglang(candidates, first, sibling)
    assert parents.tolist() == [[0, 0, 1, 1], [0, 1, 2, 0]]
    got = from_sglang(candidates.int(), first.int(), sibling.int())
    assert got[0].dtype == torch.int32 and torch.equal(got[0], ids.int())
    assert torch.equal(got[1], parents)


@pytest.mark.parametrize("name", NAMES[1:])
@pytest.mark.parametrize("value", [-2, 5])
def test_validate_mode_refuses_a_link_to_no_node(monkeypatch, name, value):
    args = dict(zip(NAMES, two_trees()))
    expected = from_sglang(*args.values())
    args[name] = args[name].clone()
    args[name][1, 2] = value  # unvalidated, such a link is ignored
    from_sglang(*args.values())
    monkeypatch.setenv("SPECOPS_VALIDATE", "1")
    assert all(torch.equal(a, b) for a, b in zip(from_sglang(*two_trees()), expected))
    with pytest.raises(ValueError) as info:
        from_sglang(*args.values())
    assert str(info.value) == (f"{name} must be -1 (end of list) or a node in [0, 4]; got {value} "
                               "at index (1, 2) (SPECOPS_VALIDATE=1)")


def test_compiled_fullgraph(monkeypatch):
    """Traced whole, SPECOPS_VALIDATE=1 too (the traced call skips the value checks: they read
    the data); a bad shape is refused while tracing, with the eager message."""
    monkeypatch.setenv("SPECOPS_VALIDATE", "1")
    args = two_trees()
    torch._dynamo.reset()
    compiled = torch.compile(from_sglang, fullgraph=True, backend="aot_eager")
    assert all(torch.equal(a, b) for a, b in zip(compiled(*args), from_sglang(*args)))
    chain = errors_while_tracing(from_sglang, args[0], args[1][:, :4], args[2])
    assert any("retrive_next_token must have shape" in str(e) for e in chain), chain
