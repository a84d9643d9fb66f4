"""Rows of logits turned into the distributions each request's sampling parameters ask for: the
plain reference of the rule every sampler that takes logits applies (docs/semantics.md,
"Verification from logits"), in vLLM's sampler order, row by row.

For a row of logits x (read as float32) and its request's temperature T, top-k k, top-p P and
min-p M:

1. A logit that is NaN or infinite counts as -inf: it is never kept.
2. T == 0: the row is greedy, one-hot at its largest logit (the lowest index on ties).
3. T > 0: the weights e = exp2((x - max(x)) * c), c = log2(e) / T, all float32: the softmax of
   x / T before normalising, 1 at the largest logit.
4. min-p: keep the tokens with e >= M (p >= M * max(p)); M == 0 keeps all.
5. top-k: of what is left, keep the tokens with e at least the k-th largest e (ties kept);
   k == 0 or k >= V keeps all.
6. top-p: of what is left, keep the tokens with e >= t, for the largest t among their weights
   whose kept mass W(t) = sum(e >= t) is at least P * W(0); P == 1 keeps all. Masses are exact
   sums of the float32 chunk masses (core/sums.py), compared in float64.
7. p = e * r for the kept tokens, r = 1 / W (W the kept mass; r rounded to float32), 0 elsewhere.

A request whose parameters are out of range (T negative or NaN, k negative, P outside (0, 1], M
outside [0, 1]) has rows without mass; validation mode refuses them. A row without a finite logit
has no mass either. Every step reads its own row and its own request's parameters only.
"""

from __future__ import annotations

import math

import torch

from .race import chunk_masses
from .sums import exact_total

LOG2E = float(torch.tensor(1 / math.log(2), dtype=torch.float32))  # log2(e), as float32


def weights(logits: torch.Tensor, temperature: torch.Tensor, peak: torch.Tensor | None = None):
    """Steps 1 and 3 for rows (R, V) and their temperatures (R,): (valid logits (R, V) bool,
    float32 weights e (R, V), 0 where invalid; rows without a valid logit have none).

    peak: each row's largest valid logit (R, 1) float32, given when the rows are shards of longer
    rows (a vocabulary shard); by default the rows' own."""
    x = logits.float()
    valid = torch.isfinite(x)
    if peak is None:
        peak = torch.where(valid, x, -torch.inf).amax(dim=-1, keepdim=True)
    c = (LOG2E / temperature.float())[:, None]  # float32 division, correctly rounded
    e = torch.where(valid, torch.exp2((x - peak) * c), 0.0)
    return valid, e


def greedy_rows(logits: torch.Tensor, valid: torch.Tensor) -> torch.Tensor:
    """Step 2: one-hot float32 rows at the largest valid logit (the lowest index on ties); all
    zero where a row has no valid logit."""
    x = torch.where(valid, logits.float(), -torch.inf)
    top = x.argmax(dim=-1)  # the first of equal maxima
    one_hot = torch.nn.functional.one_hot(top, x.shape[-1]).float()
    return torch.where(valid.any(dim=-1, keepdim=True), one_hot, 0.0)


def kept_mass(e: torch.Tensor, keep: torch.Tensor) -> torch.Tensor:
    """float64 (R,): the exact sum of the float32 chunk masses of the kept weights."""
    return exact_total(chunk_masses(torch.where(keep, e, 0.0)))


def top_k_threshold(e: torch.Tensor, keep: torch.Tensor, top_k: torch.Tensor) -> torch.Tensor:
    """Step 5's threshold (R, 1): the k-th largest kept weight, or -1 (keep all) where k is 0,
    at least V, or more than the tokens kept."""
    vocab = e.shape[-1]
    ranked = torch.where(keep, e, -1.0).sort(dim=-1, descending=True).values
    k = top_k.long()
    active = (k > 0) & (k < vocab)
    kth = ranked.gather(-1, (k.clamp(1, vocab) - 1)[:, None])
    return torch.where(active[:, None], kth, -1.0)


def top_p_threshold(e: torch.Tensor, keep: torch.Tensor, top_p: torch.Tensor) -> torch.Tensor:
    """Step 6's threshold (R, 1): the largest kept weight t with W(t) >= P * W(0), found by
    bisection over the kept weights in descending order (W grows along it); -1 where P >= 1."""
    ranked = torch.where(keep, e, -1.0).sort(dim=-1, descending=True).values
    goal = top_p.double() * kept_mass(e, keep)
    # The answer's index in `ranked` is in [lo, hi]: W(ranked[count - 1]) = W(0) >= goal.
    lo = torch.zeros_like(goal, dtype=torch.long)
    hi = (keep.sum(dim=-1) - 1).clamp(min=0)
    for _ in range(max(1, e.shape[-1]).bit_length()):
        mid = (lo + hi) // 2
        t = ranked.gather(-1, mid[:, None])
        enough = kept_mass(e, keep & (e >= t)) >= goal
        hi = torch.where(enough, mid, hi)
        lo = torch.where(enough, lo, mid + 1)
    threshold = ranked.gather(-1, hi[:, None])
    return torch.where((top_p < 1)[:, None], threshold, -1.0)


def out_of_range(temperature, top_k, top_p, min_p) -> torch.Tensor:
    """(R,) bool: the requests whose parameters lie outside their ranges (their rows get no
    mass)."""
    return ~((temperature >= 0) & (top_k >= 0) & (top_p > 0) & (top_p <= 1) & (min_p >= 0)
             & (min_p <= 1))


def processed_rows(logits: torch.Tensor, temperature: torch.Tensor, top_k: torch.Tensor,
                   top_p: torch.Tensor, min_p: torch.Tensor) -> torch.Tensor:
    """The float32 distributions (R, V) of rows of logits (R, V) under each row's parameters
    (R,) (temperature, top_p, min_p float; top_k int): steps 1-7 above."""
    valid, e = weights(logits, temperature)
    keep = valid & (e >= min_p.float()[:, None])
    keep &= e >= top_k_threshold(e, keep, top_k)
    keep &= e >= top_p_threshold(e, keep, top_p)
    return finished_rows(e, keep, kept_mass(e, keep), greedy_rows(logits, valid), temperature,
                         top_k, top_p, min_p)


def finished_rows(e, keep, mass, greedy, temperature, top_k, top_p, min_p) -> torch.Tensor:
    """Step 7 from the kept weights and their exact mass (R,) float64, then the greedy rows
    (T == 0) and the rows without mass (parameters out of range)."""
    scale = (1.0 / mass).float()[:, None]  # inf without mass: nothing is kept then
    sampled = torch.where(keep, e * scale, 0.0)
    rows = torch.where((temperature == 0)[:, None], greedy, sampled)
    return torch.where(out_of_range(temperature, top_k, top_p, min_p)[:, None], 0.0, rows)


# ------------------------------------------------------------------------ the parameters' forms

FLOAT_DTYPES = (torch.float32, torch.float64)
INT_DTYPES = (torch.int32, torch.int64)
# name -> (the dtypes its tensors may have, its value when None: the step is off)
PARAMETERS = {"temperature": (FLOAT_DTYPES, 1.0), "top_k": (INT_DTYPES, 0),
              "top_p": (FLOAT_DTYPES, 1.0), "min_p": (FLOAT_DTYPES, 0.0)}
INTEGER_PARAMETERS = ("top_k",)
RANGES = {"temperature": "a number >= 0 (0: greedy)", "top_k": "an int >= 0 (0: off)",
          "top_p": "a number in (0, 1] (1: off)", "min_p": "a number in [0, 1] (0: off)"}


def in_range(name: str, value: torch.Tensor) -> torch.Tensor:
    """Where a parameter's values lie in its range (``RANGES``)."""
    if name == "temperature":
        return value >= 0
    if name == "top_k":
        return value >= 0
    if name == "top_p":
        return (value > 0) & (value <= 1)
    return (value >= 0) & (value <= 1)


def check_parameters(parameters: dict, batch: int, device: torch.device, reference: str) -> None:
    """The parameter tensors a registered op takes: 1-D, 1 or ``batch`` elements, of their dtypes,
    on ``device``; a clear error naming the one that is not."""
    for name, value in parameters.items():
        dtypes = PARAMETERS[name][0]
        if not isinstance(value, torch.Tensor):
            raise TypeError(f"{name} must be a tensor; got {type(value).__name__}")
        if value.dim() != 1 or value.shape[0] not in (1, batch):
            raise ValueError(f"{name} must be a 1-D tensor of 1 or batch_size ({batch}) "
                             f"elements; got shape {tuple(value.shape)}")
        if value.dtype not in dtypes:
            allowed = " or ".join(str(d).replace("torch.", "") for d in dtypes)
            raise TypeError(f"{name} must have dtype {allowed}; got "
                            f"{str(value.dtype).replace('torch.', '')}")
        if value.device != device:
            raise ValueError(f"{name} must be on the same device as {reference} ({device}); "
                             f"got {value.device}")


def check_parameter_values(parameters: dict) -> None:
    """SPECOPS_VALIDATE=1: refuse parameter values out of their ranges, naming the first."""
    from .checks import first_bad_index

    for name, value in parameters.items():
        where = first_bad_index(~in_range(name, value))
        if where is not None:
            raise ValueError(f"{name} must be {RANGES[name]}; got {value[where].item()} at index "
                             f"{where} (SPECOPS_VALIDATE=1)")


def as_parameter(name: str, value, device: torch.device, cache: dict | None) -> torch.Tensor:
    """A public function's parameter (None, a number for every request, or a tensor of 1 or B
    values) as the tensor its op takes. Numbers out of range are refused here, at once; tensors
    are passed on as they are (validation mode checks their values)."""
    dtypes, off = PARAMETERS[name]
    if value is None:
        value = off
    if isinstance(value, torch.Tensor):
        return value.reshape(-1) if value.dim() == 0 else value
    if isinstance(value, bool) or not isinstance(value, (int, float)) and not hasattr(
            value, "__index__") and not hasattr(value, "__float__"):
        raise TypeError(f"{name} must be {RANGES[name]}, or a tensor of 1 or batch_size values; "
                        f"got {type(value).__name__}")
    integer = name in INTEGER_PARAMETERS
    number = int(value) if integer else float(value)
    if integer and number != value:
        raise TypeError(f"{name} must be an int; got {value!r}")
    key = (name, number, device)
    tensor = None if cache is None else cache.get(key)
    if tensor is None:  # a cached tensor's number was checked when it was made
        if not bool(in_range(name, torch.tensor(number))):
            raise ValueError(f"{name} must be {RANGES[name]}; got {value!r}")
        with torch.inference_mode(False), torch.no_grad():
            tensor = torch.tensor([number], dtype=torch.int64 if integer else torch.float32,
                                  device=device)
        if cache is not None and len(cache) < 256:  # never evicted: a graph may hold them
            cache[key] = tensor
    return tensor
