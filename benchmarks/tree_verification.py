"""Tree verification against chain verification: what it costs, and what it gains.

    python benchmarks/tree_verification.py                 # cost + tokens per call, CPU (and GPU)
    python benchmarks/tree_verification.py --quick         # a smoke test

Cost: median time per call of the tree op on full trees (WIDTH children per node, DEPTH levels,
children drawn from the draft rows) with draft probabilities and target-only, of the chain op on
a chain of DEPTH drafts, and the tree op's memory floor: the rows a walk must read for the
outcome of that very call (a node's target and draft rows where it rejected a child, the target
row where it drew a token), once, at the device's copy bandwidth. Gain: tokens per target call of
trees against the chain of the same depth on the demo's character models.
"""

from __future__ import annotations

import argparse
import contextlib
import io

import torch

import common  # benchmarks/common.py: a script's own folder is on sys.path

SHAPES = [(1, 2, 4, 32000), (8, 2, 4, 32000), (64, 2, 4, 32000), (8, 3, 3, 128256),
          (64, 4, 3, 32000)]
QUICK_SHAPES = [(2, 2, 2, 2000)]


def full_tree(width: int, depth: int) -> torch.Tensor:
    from specops.demo import full_tree_parents

    return full_tree_parents(width, depth, "cpu")


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


def tokens_per_call(device: torch.device, quick: bool) -> None:
    from specops import demo

    size = ["--batch-size", "16", "--length", "32"] if quick else ["--batch-size", "64",
                                                                    "--length", "256"]
    print(f"\ntokens per target call on the demo's models ({size[1]} sequences x {size[3]} "
          "characters, eager), the tree against the chain of its depth")
    for tree in (("2x2",) if quick else ("2x2", "2x4", "3x3", "4x3")):
        for children in ("sampled", "distinct", "top-k"):
            quiet = (contextlib.redirect_stdout(io.StringIO()),
                     contextlib.redirect_stderr(io.StringIO()))
            with quiet[0], quiet[1]:  # the demo's report and progress bars
                result = demo.main(["--device", device.type, "--tree", tree, "--tree-children",
                                    children, *size, "--no-compile"])
            print(f"  {tree} {children:8s}: tree {result['characters_per_call']:.3f}, chain "
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
