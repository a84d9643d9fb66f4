"""The sampling parameters as the registered ops take them (tensors of 1 or B values), what the
public functions make of Python numbers, and their argument and value checks (errors name the
parameter). The rule that applies them is ``rule.py``."""

from __future__ import annotations

import math

import torch

from ..ops.checks import first_bad_index
from ..sampling.probs import as_float, as_float32

FLOAT_DTYPES = (torch.float32, torch.float64)
INT_DTYPES = (torch.int32, torch.int64)
# name -> (the dtypes its tensors may have, its value when None: the step is off)
PARAMETERS = {"temperature": (FLOAT_DTYPES, 1.0), "top_k": (INT_DTYPES, 0),
              "top_p": (FLOAT_DTYPES, 1.0), "min_p": (FLOAT_DTYPES, 0.0),
              "repetition_penalty": (FLOAT_DTYPES, 1.0), "frequency_penalty": (FLOAT_DTYPES, 0.0),
              "presence_penalty": (FLOAT_DTYPES, 0.0)}
SAMPLING = ("temperature", "top_k", "top_p", "min_p")  # every from-logits op takes them
PENALTIES = ("repetition_penalty", "frequency_penalty", "presence_penalty")  # None: off
INTEGER_PARAMETERS = ("top_k",)
INT64_MAX = 2**63 - 1
# Read as float32 whatever their tensors' dtype, as the kernels read them; the penalties are
# read as given.
FLOAT32_READ = ("temperature", "top_p", "min_p")
# The draft's own parameters, for rows given as draft logits (None: the target's): the
# distribution the drafter sampled from may differ from the one the target's tokens follow.
DRAFT_PARAMETERS = tuple(f"draft_{name}" for name in SAMPLING)
RANGES = {"temperature": "a number >= 0 (0: greedy)",
          "top_k": "an int >= 0 (0: off, where some engines write -1)",
          "top_p": "a number in (0, 1] (1: off)", "min_p": "a number in [0, 1] (0: off)",
          "repetition_penalty": "a finite number > 0 (1: off)",
          "frequency_penalty": "a finite number (0: off)",
          "presence_penalty": "a finite number (0: off)"}


# The registered ops take the draft's parameters last, each None (the target's) by default.
DRAFT_SCHEMA = ", ".join(f"Tensor? {name}=None" for name in DRAFT_PARAMETERS)


def named(temperature, top_k, top_p, min_p, draft_temperature=None, draft_top_k=None,
          draft_top_p=None, draft_min_p=None) -> dict:
    """An op's parameter tensors by name (the draft's None where they are the target's)."""
    return dict(temperature=temperature, top_k=top_k, top_p=top_p, min_p=min_p,
                draft_temperature=draft_temperature, draft_top_k=draft_top_k,
                draft_top_p=draft_top_p, draft_min_p=draft_min_p)


def base_name(name: str) -> str:
    """The parameter a name stands for: ``draft_top_p`` is a ``top_p``."""
    return name[len("draft_"):] if name.startswith("draft_") else name


def in_range(name: str, value):
    """Where a parameter's values lie in its range (``RANGES``): a bool tensor for a tensor, a
    bool for a Python number (NaN is in no range)."""
    name = base_name(name)
    if name == "repetition_penalty":
        return (value > 0) & (value < math.inf)
    if name in PENALTIES:
        return (value > -math.inf) & (value < math.inf)
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
        if value is None and name not in SAMPLING:  # the draft's (the target's), or off
            continue
        dtypes = PARAMETERS[base_name(name)][0]
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


def check_draft_parameters_apply(parameters: dict, draft_logits, draft_logits_name: str) -> None:
    """The draft's parameters process draft logits: given without them, they would do nothing,
    which a caller cannot have meant."""
    if draft_logits is not None:
        return
    for name in DRAFT_PARAMETERS:
        if parameters.get(name) is not None:
            raise ValueError(f"{name} processes {draft_logits_name}, which were not given "
                             "(draft probabilities are used as given)")


def check_parameter_values(parameters: dict) -> None:
    """SPECOPS_VALIDATE=1: refuse parameter values out of their ranges, naming the first. Each is
    checked as the ops read it: temperature, top-p and min-p as float32 (``read_as``)."""
    for name, value in parameters.items():
        if value is None:  # the draft's (the target's), or off
            continue
        read = read_as(name, value)
        where = first_bad_index(~in_range(name, read))
        if where is not None:
            raise ValueError(f"{name} must be {RANGES[base_name(name)]}; got "
                             f"{value[where].item()}{as_read(value, read, where)} at index "
                             f"{where} (SPECOPS_VALIDATE=1)")


def read_as(name: str, value: torch.Tensor) -> torch.Tensor:
    """A parameter tensor as the ops read it: temperature, top-p and min-p as float32 (a float64
    value counts as its float32 rounding, ``rule.per_row``), the others as given."""
    return value.float() if base_name(name) in FLOAT32_READ else value


def as_read(value: torch.Tensor, read: torch.Tensor, where: int) -> str:
    """What an error adds after a value that is read otherwise: its value as read."""
    return "" if read.dtype == value.dtype else f" (read as float32: {read[where].item()})"


def as_parameter(name: str, value, device: torch.device) -> torch.Tensor:
    """A public function's parameter (None, a number for every request, or a tensor of 1 or B
    values) as the tensor its op takes. Numbers out of range are refused here, at once; tensors
    are passed on as they are (validation mode checks their values)."""
    dtypes, off = PARAMETERS[base_name(name)]
    if value is None:
        value = off
    if isinstance(value, torch.Tensor):
        return value.reshape(-1) if value.dim() == 0 else value
    if isinstance(value, bool) or not isinstance(value, (int, float)) and not hasattr(
            value, "__index__") and not hasattr(value, "__float__"):
        raise TypeError(f"{name} must be {RANGES[base_name(name)]}, or a tensor of 1 or "
                        f"batch_size values; "
                        f"got {type(value).__name__}")
    integer = base_name(name) in INTEGER_PARAMETERS
    try:
        number = int(value) if integer else as_float(value)
    except TypeError:  # a number-like object that is not one number (a numpy array, say)
        raise TypeError(f"{name} must be {RANGES[base_name(name)]}, or a tensor of 1 or "
                        f"batch_size values; got {type(value).__name__}") from None
    except (OverflowError, ValueError):  # int() of an infinity or a NaN
        number = None
    if integer and (number is None or number != value):
        raise TypeError(f"{name} must be an int; got {value!r}")
    # On the Python number (no tensor made to check it), as the float32 it becomes.
    read = number if integer else as_float32(number)
    if not in_range(name, read):
        shown = "" if read == number else f" (as float32: {read!r})"
        raise ValueError(f"{name} must be {RANGES[base_name(name)]}; got {value!r}{shown}")
    if integer:  # a k past int64's range keeps every token, as any k >= V does
        read = min(read, INT64_MAX)
    # torch.full costs half torch.tensor's; it takes the float32 value read (it refuses a float64
    # past float32's range, which rounds to inf).
    return torch.full((1,), read, dtype=torch.int64 if integer else torch.float32, device=device)


def as_parameters(device: torch.device, temperature, top_k, top_p, min_p, draft_temperature=None,
                  draft_top_k=None, draft_top_p=None, draft_min_p=None) -> dict:
    """A public function's parameters (``as_parameter`` each) by name, as its op takes them: the
    draft's stay None where not given (the op then uses the target's)."""
    given = named(temperature, top_k, top_p, min_p, draft_temperature, draft_top_k, draft_top_p,
                  draft_min_p)
    return {name: None if value is None and name in DRAFT_PARAMETERS else
            as_parameter(name, value, device) for name, value in given.items()}


def as_penalties(device: torch.device, repetition_penalty, frequency_penalty,
                 presence_penalty) -> tuple:
    """A public function's penalties as its op takes them: None where not given (off), else
    ``as_parameter``'s tensor."""
    return tuple(None if value is None else as_parameter(name, value, device)
                 for name, value in zip(PENALTIES, (repetition_penalty, frequency_penalty,
                                                    presence_penalty)))
