"""Goodness-of-fit p-values, for the demo's lossless check and the statistical tests.

No scipy: the chi-square upper tail is the regularized upper incomplete gamma function,
Q(dof / 2, x / 2) = ``torch.special.gammaincc``, and the normal two-sided tail is ``erfc``.
"""

from __future__ import annotations

import math

import torch


def chi2_pvalue(observed: torch.Tensor, probs: torch.Tensor) -> float:
    """Pearson chi-square goodness-of-fit p-value of counts ``observed`` against ``probs``.

    ``probs`` is normalised here. A count in a zero-probability category is an impossible outcome:
    p-value 0. Categories expected fewer than 5 times are pooled into one, so that the chi-square
    approximation holds; a pool still expected fewer than 5 times joins the smallest other category.
    """
    observed = observed.double().flatten()
    probs = probs.double().flatten()
    probs = probs / probs.sum()
    n = observed.sum()
    impossible = probs == 0
    if bool((observed[impossible] > 0).any()):
        return 0.0
    observed, expected = observed[~impossible], n * probs[~impossible]
    small = expected < 5
    if bool(small.any()):
        pooled_o, pooled_e = observed[small].sum(), expected[small].sum()
        observed, expected = observed[~small], expected[~small]
        if pooled_e >= 5 or expected.numel() == 0:
            observed = torch.cat([observed, pooled_o[None]])
            expected = torch.cat([expected, pooled_e[None]])
        else:
            i = int(expected.argmin())
            observed[i] += pooled_o
            expected[i] += pooled_e
    dof = expected.numel() - 1
    if dof < 1:
        return 1.0
    stat = ((observed - expected) ** 2 / expected).sum()
    return float(torch.special.gammaincc(torch.tensor(dof / 2, dtype=torch.float64), stat / 2))


def normal_pvalue(observed_mean: float, mean: float, var: float, n: int) -> float:
    """Two-sided p-value of a sample mean of n iid draws with the given mean and variance."""
    z = (observed_mean - mean) / math.sqrt(var / n)
    return math.erfc(abs(z) / math.sqrt(2))
