"""SGLang's tree layout (first child / next sibling) turned into the tree op's parents
(specops/tree/adapters.py), on lists built the way SGLang's tree builder builds them and the other
way round, and on EAGLE-style top-k trees verified end to end."""

from __future__ import annotations

import pytest
import torch

import specops
from specops.tree.adapters import from_sglang
from specops.tree.arguments import present_nodes

from inputs import full_tree


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
