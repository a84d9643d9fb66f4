"""A tree's rows of logits processed by each request's sampling parameters, then verified as
probabilities: the rule of verification from logits (docs/semantics.md, "Verification from
logits") for the tree's backends. No op plumbing: the reference imports it."""

from __future__ import annotations

import torch

from ..core.logits import rule


def on_processed_rows(verify, process=rule.processed_requests):
    """The from-logits backend of a tree verifier of probabilities: the target's rows (after rule
    step 0 where given: grammar mask, logit bias, penalties counting each node's path as
    generated) and the draft's, given as logits, processed by ``process`` (requests' rows
    (B, rows, V) and 1 or B values of each parameter -> float32 rows: the rule of
    core/logits/rule.py, or a faster way to the same rows), then ``verify`` on them."""
    def backend(draft_probs, draft_token_ids, parents, target_logits, draft_logits, seed, offset,
                temperature, top_k, top_p, min_p, with_replacement=True, *rest):
        draft_parameters, step, order, verification = rule.optional_arguments(rest)
        min_p_last = rule.ORDERS[order]
        parameters = (temperature, top_k, top_p, min_p)
        target_logits = step.adjusted(
            target_logits, lambda counts: tree_generated(counts, draft_token_ids, parents))
        target_probs = process(target_logits, *parameters, min_p_last=min_p_last)
        if draft_logits is not None:  # by the draft's own parameters, each None the target's
            draft_probs = process(draft_logits, *rule.drafts_own(draft_parameters, parameters),
                                  min_p_last=min_p_last)
        elif draft_probs is not None:
            draft_probs = draft_probs.float()  # the dtype of the processed target rows
        return verify(draft_probs, draft_token_ids, parents, target_probs, seed, offset,
                      with_replacement, *verification)
    backend.__name__ = verify.__name__.replace("_speculative_sampling",
                                               "_speculative_sampling_from_logits")
    return backend


def tree_generated(counts, draft_token_ids, parents) -> torch.Tensor:
    """(B, M + 1, V) int64: node n's generated tokens, the output's counts (B, V) and the tokens
    on the path from the root to node n, n's own included (row n is the target's after that
    path). An absent node's row, never read, counts whatever its links give."""
    vocab = counts.shape[-1]
    ids, given = draft_token_ids.long(), parents.long()
    batch, num_nodes = ids.shape
    out = counts.long()[:, None, :].repeat(1, num_nodes + 1, 1)
    request = torch.arange(batch, device=ids.device)
    for i in range(num_nodes):  # a parent comes before its children
        valid = (ids[:, i] >= 0) & (ids[:, i] < vocab)
        out[:, i + 1] = out[request, given[:, i].clamp(0, i)]
        out[request, i + 1, ids[:, i].clamp(0, vocab - 1)] += valid.long()  # its own token
    return out


def paths(draft_token_ids: torch.Tensor, parents: torch.Tensor, vocab: int) -> torch.Tensor:
    """(B, M + 1, max(M, 1)) int64: row n + 1 lists the tokens in [0, V) on the path from the root
    to node n, n's own included (row 0, the root's, none), then -1: what each row counts as
    generated (``processed.tree_generated``), as the kernels of rule step 0 read it (a list up to
    its first id outside [0, V)). A node's path is at most n + 1 long: its ancestors come before
    it. A fixed number of torch operations (log2 M pointer-jumping steps), no host
    synchronisation."""
    ids, given = draft_token_ids.long(), parents.long()
    batch, num_nodes = ids.shape
    device = ids.device
    if num_nodes == 0:
        return torch.full((batch, 1, 1), -1, dtype=torch.int64, device=device)
    rows = num_nodes + 1
    node = torch.arange(num_nodes, device=device)
    # Each row's parent row, the root its own: node i (row i + 1) under row given_i in [0, i].
    up = torch.cat([torch.zeros((batch, 1), dtype=torch.int64, device=device),
                    torch.minimum(given.clamp(min=0), node).expand(batch, num_nodes)], dim=1)
    # on_path[b, n, r]: row r is row n or one of its ancestors. After s steps it holds the 2^s
    # nearest (up: the 2^s-th ancestor), all of them once 2^s >= M + 1.
    on_path = torch.eye(rows, dtype=torch.bool, device=device).expand(batch, rows, rows)
    for _ in range(num_nodes.bit_length()):
        on_path = on_path | on_path.gather(1, up[:, :, None].expand(batch, rows, rows))
        up = up.gather(1, up)
    counted = on_path[:, :, 1:] & ((ids >= 0) & (ids < vocab))[:, None, :]  # (B, M + 1, M)
    # The counted nodes first, in node order (every node's ancestors come before it).
    order = torch.where(counted, node, num_nodes).sort(dim=-1).values
    tokens = ids.gather(1, order.clamp(max=num_nodes - 1).view(batch, rows * num_nodes))
    tokens = tokens.view(order.shape)
    return torch.where(order < num_nodes, tokens, -1)
