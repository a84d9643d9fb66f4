"""Small static worlds for the sequence-level statistical tests (tests/test_block_statistics.py,
test_tree_statistics.py, test_logits_statistics.py): rows that depend on the absolute position
alone, so the target's sequences are independent tokens, token t drawn from row t, and whole
sequences decoded by repeated calls can be tested against the product of the rows."""

from __future__ import annotations

import torch

from specops.demo.stats import chi2_pvalue


def make_world(vocab: int, positions: int, seed: int, scale: float):
    """Target rows P and draft rows Q (positions, V), float64, one per absolute position:
    independent softmaxes of Gaussian logits times ``scale``."""
    g = torch.Generator().manual_seed(seed)
    p = torch.softmax(scale * torch.randn(positions, vocab, generator=g, dtype=torch.float64), -1)
    q = torch.softmax(scale * torch.randn(positions, vocab, generator=g, dtype=torch.float64), -1)
    return p, q


def joint_pvalue(tokens: torch.Tensor, rows: torch.Tensor) -> float:
    """Chi-square p-value of the joint distribution of the sequences' first L tokens (tokens
    (sequences, L)) against the product of rows 0..L-1 (positions, V)."""
    length, vocab = tokens.shape[1], rows.shape[1]
    index = (tokens * vocab ** torch.arange(length)).sum(1)
    counts = torch.bincount(index, minlength=vocab**length)
    expected = rows[0]
    for t in range(1, length):
        expected = torch.outer(rows[t], expected).flatten()  # index = tok_0 + V tok_1 + ...
    return chi2_pvalue(counts, expected)


def two_sample_pvalue(a: torch.Tensor, b: torch.Tensor) -> float:
    """Chi-square p-value that two samples' counts over the same categories (a, b) come from one
    distribution (a 2 x K contingency table; categories neither sample reached are dropped)."""
    a, b = a.double().flatten(), b.double().flatten()
    seen = (a + b) > 0
    a, b = a[seen], b[seen]
    if a.numel() < 2:
        return 1.0
    pooled = (a + b) / (a.sum() + b.sum())
    stat = sum(((x - x.sum() * pooled) ** 2 / (x.sum() * pooled)).sum() for x in (a, b))
    dof = torch.tensor((a.numel() - 1) / 2, dtype=torch.float64)
    return float(torch.special.gammaincc(dof, stat / 2))
