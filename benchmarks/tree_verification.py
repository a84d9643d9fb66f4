"""Tree verification against chain verification: what it costs, and what it gains; and traversal
verification of trees against token verification.

    python benchmarks/tree_verification.py                 # cost + tokens per call, CPU (and GPU)
    python benchmarks/tree_verification.py --quick         # a smoke test

Cost: median time per call of the tree op on full trees (WIDTH children per node, DEPTH levels,
children drawn from the draft rows) with draft probabilities and target-only, of the chain op on
a chain of DEPTH drafts, and the tree op's memory floor: the rows a walk must read for the
outcome of that very call (a node's target and draft rows where it rejected a child, the target
row where it drew a token), once, at the device's copy bandwidth. Gain: tokens per target call of
trees against the chain of the same depth on the demo's character models.

Traversal: tokens per target call (drafts kept + 1) of traversal verification (Weng et al. 2025)
against token verification on worlds shaped like the paper's: a chain, full trees and EAGLE-style
sparse trees of depth 4-5, children drawn from the draft rows i.i.d. or without replacement, target
and draft agreeing about as well as there (token verification keeps 3.5-4.7 tokens per call on the
depth-5 trees); both rules judge the same trees with the same seeds. Then the traversal op's time
per call against the token op's on the cost table's shapes, beside the token op's memory floor
(the same definition: a yardstick, not the traversal's own floor).
"""

from __future__ import annotations

import argparse
import contextlib
import io
import math

import torch

import common  # benchmarks/common.py: a script's own folder is on sys.path

SHAPES = [(1, 2, 4, 32000), (8, 2, 4, 32000), (64, 2, 4, 32000), (8, 3, 3, 128256),
          (64, 4, 3, 32000)]
QUICK_SHAPES = [(2, 2, 2, 2000)]

# Traversal worlds: (name, kind, width, depth). Every node's target logits are SCALE times normal
# draws; the draft's are MIX of them plus 1 - MIX of draws of their own, which puts token
# verification's tokens per call where the paper's models put it.
TRAVERSAL_WORLDS = [("chain 5", "full", 1, 5), ("full 2x4", "full", 2, 4),
                    ("full 2x5", "full", 2, 5), ("sparse 3x5", "sparse", 3, 5),
                    ("sparse 4x4", "sparse", 4, 4)]
QUICK_TRAVERSAL_WORLDS = [("full 2x2", "full", 2, 2)]
TRAVERSAL_VOCAB, SCALE, MIX = 128, 3.0, 0.8
TRAVERSAL_TREES, QUICK_TRAVERSAL_TREES = 3000, 200  # trees per world and rule, in chunks of 1000
TEMPERATURES = (0.2, 0.6, 1.0)  # the paper's trend: gains grow with the temperature
TRAVERSAL_SHAPES = [SHAPES[0], SHAPES[2], SHAPES[4]]  # the cost table's, fewer: slow on a CPU


def full_tree(width: int, depth: int) -> torch.Tensor:
    from specops.demo import full_tree_parents

    return full_tree_parents(width, depth, "cpu")


def sparse_tree(width: int, depth: int) -> torch.Tensor:
    """(M,) parents of an EAGLE-style sparse tree: a node reached through siblings' ranks r1, r2,
    ... (0: the first drawn) has width - (r1 + r2 + ...) children, so likelier branches grow wider
    (3x5: 55 nodes, 4x4: 69), numbered level by level."""
    parents, level, count = [], [(0, 0)], 1  # the level's (node, rank sum)
    for _ in range(depth):
        below = []
        for node, ranks in level:
            for rank in range(width - ranks):
                parents.append(node)
                below.append((count, ranks + rank))
                count += 1
        level = below
    return torch.tensor(parents)


def tree_inputs(batch, width, depth, vocab, dtype, device, gen):
    """(draft, ids, parents, target) of full trees: target and draft rows that roughly agree, as
    common.make_inputs draws them, every node's token drawn from its parent's draft row."""
    parents = full_tree(width, depth)
    num_nodes = parents.shape[0]
    logits = torch.randn(batch, num_nodes + 1, vocab, generator=gen, device=gen.device) * 3
    target = logits.softmax(-1)
    draft = (logits + torch.randn(logits.shape, generator=gen, device=gen.device)).softmax(-1)
    rows = draft[:, parents]
    race = torch.empty_like(rows).exponential_(generator=gen)
    ids = (rows / race).argmax(-1)
    return (draft.to(device, dtype), ids.to(device), parents.to(device).expand(batch, -1),
            target.to(device, dtype))


def floor_bytes(draft, ids, parents, target, seed, offset, with_draft: bool) -> int:
    """The bytes a walk must read for this call's outcome: the target and draft rows of every
    node where it rejected a child, the target row of the node it drew its token at when it
    rejected none there (target-only: the target row of every node it stood on), and the ids and
    parents. Counted from the reference's own steps, on the CPU."""
    from specops.tree import reference, slots

    draft, ids, parents, target = (t.cpu() for t in (draft, ids, parents, target))
    seed, offset = seed.cpu(), offset.cpu()
    batch, num_nodes = ids.shape
    item = target.element_size()
    vocab = target.shape[2]
    index_bytes = batch * num_nodes * (ids.element_size() + parents.element_size())
    tree = reference.read_tree(ids, parents, vocab)
    if not with_draft:
        walk, _ = reference.walk_target_only(target, tree, seed, offset)
        return index_bytes + int((walk.depth + 1).sum()) * vocab * item
    rejected_at = set()

    def masses(draft_probs, target_probs, node, weight, needed):
        rejected_at.update(zip(needed.nonzero().squeeze(1).tolist(), node[needed].tolist()))
        return reference.residual_masses(draft_probs, target_probs, node, weight, needed)

    coins = reference.request_uniforms(seed, offset, batch, 2 * num_nodes,  # node i's coin
                                       slots.coin_slot(vocab, 1))[:, ::2]
    walk, state = reference.walk_with_drafts(draft, target, tree, coins, True, masses=masses)
    draws_p = int((state.rejections == 0).sum())  # a draw at a node without a rejection: p
    return index_bytes + (2 * len(rejected_at) + draws_p) * vocab * item


def cost(device: torch.device, quick: bool) -> None:
    import specops  # noqa: F401 (registers torch.ops.specops)

    gen = torch.Generator(device=device).manual_seed(0)
    bandwidth = common.copy_bandwidth(device)
    print(f"cost on {common.describe_device(device)}, copy bandwidth {bandwidth / 1e9:.1f} GB/s "
          "(read + write)")
    print(f"{'B':>4s} {'tree':>5s} {'M':>4s} {'V':>7s} {'dtype':>9s} {'chain us':>9s} "
          f"{'tree us':>9s} {'floor us':>9s} {'tree/floor':>10s} {'target-only us':>14s} "
          f"{'floor us':>9s}")
    dtypes = (torch.float32, torch.bfloat16) if device.type == "cuda" else (torch.float32,)
    timing = dict(min_time=0.02, max_reps=3) if quick else {}
    for batch, width, depth, vocab in (QUICK_SHAPES if quick else SHAPES):
        for dtype in dtypes:
            trees = [tree_inputs(batch, width, depth, vocab, dtype, device, gen) for _ in range(3)]
            chains = [common.make_inputs(batch, depth, vocab, dtype, device, gen) for _ in range(3)]
            seed = torch.tensor([1], device=device)
            offset = torch.tensor([0], device=device)
            acc = torch.zeros(batch, dtype=torch.int32, device=device)
            emit = torch.zeros_like(acc)
            tree_op = torch.ops.specops.tree_speculative_sampling
            chain_op = torch.ops.specops.chain_speculative_sampling

            def chain(i):
                q, d, p = chains[i]
                return chain_op(q, d, p, acc, emit, seed, offset)

            def tree(i, with_draft=True):
                q, d, par, p = trees[i]
                return tree_op(q if with_draft else None, d, par, p, seed, offset, True)

            times = {}
            for name, call in (("chain", chain), ("tree", tree),
                               ("target-only", lambda i: tree(i, False))):
                times[name] = common.time_eager(call, len(trees), device, **timing)
                if common.can_graph(device):
                    times[name] = min(times[name], common.time_graph(call, len(trees), device))
            floors = {}
            for with_draft in (True, False):
                q, d, par, p = trees[0]
                needed = floor_bytes(q, d, par, p, seed, offset, with_draft)
                floors[with_draft] = needed / (bandwidth / 2)  # a read only
            print(f"{batch:4d} {f'{width}x{depth}':>5s} {par.shape[1]:4d} {vocab:7d} "
                  f"{str(dtype)[6:]:>9s} {times['chain'] * 1e6:9.1f} {times['tree'] * 1e6:9.1f} "
                  f"{floors[True] * 1e6:9.1f} {times['tree'] / floors[True]:10.1f} "
                  f"{times['target-only'] * 1e6:14.1f} {floors[False] * 1e6:9.1f}", flush=True)


def traversal_world(parents, batch, temperature, with_replacement, gen):
    """(draft, ids, parents, target) on the CPU: target and draft rows of every node as the
    TRAVERSAL_WORLDS comment says, at ``temperature``; each node's children drawn from its draft
    row, i.i.d. or without replacement."""
    num_nodes, vocab = parents.shape[0], TRAVERSAL_VOCAB
    own = torch.randn(batch, num_nodes + 1, vocab, generator=gen) * SCALE
    other = torch.randn(batch, num_nodes + 1, vocab, generator=gen) * SCALE
    target = (own / temperature).softmax(-1)
    draft = ((MIX * own + (1 - MIX) * other) / temperature).softmax(-1)
    ids = torch.empty(batch, num_nodes, dtype=torch.long)
    for node in parents.unique().tolist():
        children = (parents == node).nonzero().squeeze(1)
        ids[:, children] = torch.multinomial(draft[:, node], len(children), with_replacement,
                                             generator=gen)
    return draft, ids, parents.expand(batch, -1), target


def kept_by_both(device, parents, trees, temperature, with_replacement, gen):
    """Tokens per call (drafts kept + 1) of every tree under token and traversal verification,
    the same trees and seeds for both: (token, traversal), (trees,) float64 each."""
    import specops

    kept = {"token": [], "traversal": []}
    for chunk in range(math.ceil(trees / 1000)):
        world = traversal_world(parents, min(1000, trees - 1000 * chunk), temperature,
                                with_replacement, gen)
        q, ids, par, p = (t.to(device) for t in world)
        seed, offset = torch.tensor([chunk], device=device), torch.tensor([0], device=device)
        for rule in kept:
            emitted = specops.tree_speculative_sampling(
                q, ids, par, p, with_replacement=with_replacement, verification=rule, seed=seed,
                offset=offset)[2]
            kept[rule].append(emitted.double().cpu() + 1)
    return torch.cat(kept["token"]), torch.cat(kept["traversal"])


def gain_text(token: torch.Tensor, traversal: torch.Tensor) -> str:
    """The gain in percent and its standard error (the paired differences')."""
    gain = traversal - token
    error = gain.std() / math.sqrt(len(gain)) if len(gain) > 1 else float("nan")
    return f"{100 * gain.mean() / token.mean():+7.1f}% {100 * error / token.mean():5.1f}"


def traversal_gain(device: torch.device, quick: bool) -> None:
    gen = torch.Generator().manual_seed(0)
    trees = QUICK_TRAVERSAL_TREES if quick else TRAVERSAL_TREES
    print(f"\ntraversal against token verification: tokens per target call (drafts kept + 1), "
          f"{trees} trees per row, V = {TRAVERSAL_VOCAB}, target logits ~ {SCALE:g} N(0, 1), draft "
          f"logits {MIX:g} target + {1 - MIX:.1g} own")
    print(f"  {'world':10s} {'M':>4s} {'children':>9s} {'token':>7s} {'traversal':>9s} "
          f"{'gain':>8s} {'s.e.':>5s}")
    for name, kind, width, depth in (QUICK_TRAVERSAL_WORLDS if quick else TRAVERSAL_WORLDS):
        parents = full_tree(width, depth) if kind == "full" else sparse_tree(width, depth)
        for with_replacement in ((True,) if width == 1 else (True, False)):  # one child: the same
            token, traversal = kept_by_both(device, parents, trees, 1.0, with_replacement, gen)
            children = "i.i.d." if with_replacement else "distinct"
            print(f"  {name:10s} {parents.shape[0]:4d} {children:>9s} {token.mean():7.3f} "
                  f"{traversal.mean():9.3f} {gain_text(token, traversal)}", flush=True)
    print("  paper (T = 1): Llama3.2-1B -> Llama3.1-8B chain of 5 +2.8%, binary tree +2.2%, "
          "EAGLE sparse tree +2.4%;\n  Llama-68M -> Llama2-7B up to +5.7%")
    if quick:
        return
    chain = full_tree(1, 5)
    sweep = []
    for temperature in TEMPERATURES:
        token, traversal = kept_by_both(device, chain, trees, temperature, True, gen)
        sweep.append(f"T = {temperature:g}: {token.mean():.3f} -> {traversal.mean():.3f} "
                     f"({gain_text(token, traversal).split()[0]})")
    print(f"  chain of 5 by temperature (both models' logits / T): {'; '.join(sweep)}")
    print("  paper, chains: +1.0% at T = 0.2 to +2.8% at T = 1.0")


def traversal_cost(device: torch.device, quick: bool) -> None:
    import specops  # noqa: F401 (registers torch.ops.specops)

    gen = torch.Generator(device=device).manual_seed(0)
    bandwidth = common.copy_bandwidth(device)
    print(f"\ntraversal op cost on {common.describe_device(device)} (draft probabilities, i.i.d. "
          f"children; floor: the token op's, as in the cost table)")
    print(f"{'B':>4s} {'tree':>5s} {'M':>4s} {'V':>7s} {'dtype':>9s} {'token us':>9s} "
          f"{'traversal us':>12s} {'floor us':>9s} {'traversal/floor':>15s}")
    dtypes = (torch.float32, torch.bfloat16) if device.type == "cuda" else (torch.float32,)
    timing = dict(min_time=0.02, max_reps=3) if quick else {}
    for batch, width, depth, vocab in (QUICK_SHAPES if quick else TRAVERSAL_SHAPES):
        for dtype in dtypes:
            trees = [tree_inputs(batch, width, depth, vocab, dtype, device, gen) for _ in range(3)]
            seed = torch.tensor([1], device=device)
            offset = torch.tensor([0], device=device)
            op = torch.ops.specops.tree_speculative_sampling

            def call(i, rule):
                q, d, par, p = trees[i]
                return op(q, d, par, p, seed, offset, True, rule)

            times = {}
            for rule in ("token", "traversal"):
                times[rule] = common.time_eager(lambda i: call(i, rule), len(trees), device,
                                                **timing)
                if common.can_graph(device):
                    times[rule] = min(times[rule], common.time_graph(lambda i: call(i, rule),
                                                                     len(trees), device))
            q, d, par, p = trees[0]
            floor = floor_bytes(q, d, par, p, seed, offset, True) / (bandwidth / 2)
            print(f"{batch:4d} {f'{width}x{depth}':>5s} {par.shape[1]:4d} {vocab:7d} "
                  f"{str(dtype)[6:]:>9s} {times['token'] * 1e6:9.1f} "
                  f"{times['traversal'] * 1e6:12.1f} {floor * 1e6:9.1f} "
                  f"{times['traversal'] / floor:15.1f}", flush=True)


def tokens_per_call(device: torch.device, quick: bool) -> None:
    from specops import demo

    size = ["--batch-size", "16", "--length", "32"] if quick else ["--batch-size", "64",
                                                                    "--length", "256"]
    print(f"\ntokens per target call on the demo's models ({size[1]} sequences x {size[3]} "
          "characters, eager), the tree (token verification, then traversal) against the "
          "chain of its depth")
    for tree in (("2x2",) if quick else ("2x2", "2x4", "4x3")):
        for children in ("sampled", "distinct", "top-k"):
            quiet = (contextlib.redirect_stdout(io.StringIO()),
                     contextlib.redirect_stderr(io.StringIO()))
            with quiet[0], quiet[1]:  # the demo's report and progress bars
                result = demo.main(["--device", device.type, "--tree", tree, "--tree-children",
                                    children, *size, "--no-compile"])
            print(f"  {tree} {children:8s}: tree {result['characters_per_call']:.3f}, traversal "
                  f"{result['traversal_characters_per_call']:.3f}, chain "
                  f"{result['chain_characters_per_call']:.3f} (lossless "
                  f"{'PASS' if result['lossless'] else 'FAIL'})", flush=True)


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawTextHelpFormatter)
    parser.add_argument("--device", default=None, help="cpu or cuda (default: cuda when present)")
    parser.add_argument("--quick", action="store_true", help="a tiny grid, for a smoke test")
    common.add_threads_option(parser)
    args = parser.parse_args()
    device = common.require_device(args.device or ("cuda" if torch.cuda.is_available() else "cpu"))
    common.use_threads(parser, args.threads, device)
    cost(device, args.quick)
    tokens_per_call(device, args.quick)
    traversal_gain(device, args.quick)
    traversal_cost(device, args.quick)
