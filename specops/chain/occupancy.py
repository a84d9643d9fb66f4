"""A model of how a launch of the chain kernel fills an H200, and the programs per request it picks.

The row pass is a stream of 1024-value chunks.  A program (4 warps) reads ``chunks_per_program``
chunks, then about one more chunk's worth of fixed work (re-reading the winning chunk for the
inverse CDF, the race keys).  ``resident`` programs fit on each SM at once (registers, warps), so
``SMS * resident`` slots run the ``B * P`` programs in ``waves``.  The model assumes the memory
system is saturated when every slot is busy and each busy slot gets an equal share of it:

    busy fraction  = (work of all programs) / (waves * slots * duration of the longest program)
    predicted time = LATENCY + (bytes of all programs) / BANDWIDTH / busy fraction

``programs_per_request`` picks the P (tokens do not depend on it) with the least predicted time.
docs/kernel.md tabulates the result; tests/test_launch.py checks it over B and V.
"""

from __future__ import annotations

import functools
import math
from typing import NamedTuple

import torch

from ..core.race import CHUNK_SIZE, num_chunks

# H200 (sm_90): 132 SMs, each 65536 32-bit registers, at most 64 warps, 2048 threads, 32 programs.
SMS = 132
REGISTERS_PER_SM = 65536
MAX_WARPS_PER_SM = 64
MAX_THREADS_PER_SM = 2048
MAX_PROGRAMS_PER_SM = 32
REGISTER_ALLOCATION_UNIT = 256  # registers are given to a warp in blocks of 256
BANDWIDTH = 4.8e12  # bytes/s, HBM3e peak
# Launch, acceptance gathers and, with P > 1, the combine kernel: what a step costs at any size.
LATENCY = 5e-6
# Fixed work of a program beyond its chunks, in chunk reads: the winning chunk read again (from
# L2, just read) and the race keys of its chunks. An estimate, to be calibrated on a GPU.
TAIL_CHUNKS = 0.5
# The work fills the machine when there are at least this many chunk reads per program slot: with
# fewer, a whole number of chunks per program cannot spread evenly (docs/kernel.md).
FILL_CHUNKS_PER_SLOT = 10

NUM_WARPS = 4
# Most programs per request: the combine kernel reads them in one block.
MAX_PROGRAMS_PER_REQUEST = 256
# Registers per thread of the compiled kernel (Triton 3.9.0, sm_90, num_warps=4), by probability
# dtype, draft_probs given, and V % 16 == 0 (16-byte row loads; else scalar loads and many more
# registers). tests/test_triton_compile.py checks them against every variant it compiles.
REGISTERS = {
    (torch.float32, True, True): 56,
    (torch.float32, False, True): 64,
    (torch.float16, True, True): 56,
    (torch.float16, False, True): 64,
    (torch.bfloat16, True, True): 56,
    (torch.bfloat16, False, True): 64,
    (torch.float32, True, False): 110,
    (torch.float32, False, False): 119,
    (torch.float16, True, False): 96,
    (torch.float16, False, False): 116,
    (torch.bfloat16, True, False): 110,
    (torch.bfloat16, False, False): 116,
}


def slots(dtype: torch.dtype, has_draft: bool, vocab: int) -> int:
    """Programs the whole machine holds at once."""
    return SMS * resident_programs(REGISTERS[(dtype, has_draft, vocab % 16 == 0)])


def resident_programs(registers: int, num_warps: int = NUM_WARPS) -> int:
    """Programs of ``num_warps`` warps that fit on one SM at ``registers`` registers per thread."""
    per_warp = math.ceil(registers * 32 / REGISTER_ALLOCATION_UNIT) * REGISTER_ALLOCATION_UNIT
    return min(REGISTERS_PER_SM // (per_warp * num_warps), MAX_WARPS_PER_SM // num_warps,
               MAX_THREADS_PER_SM // (num_warps * 32), MAX_PROGRAMS_PER_SM)


class LaunchPlan(NamedTuple):
    programs_per_request: int
    chunks_per_program: int
    waves: int
    busy: float  # predicted fraction of the machine's slots busy over the launch
    time: float  # predicted seconds


def plan(batch: int, chunks: int, resident: int, chunk_bytes: int, programs: int) -> LaunchPlan:
    """The model's prediction for ``programs`` programs per request (rounded so each program has
    ``chunks_per_program`` chunks and none has none)."""
    per_program = math.ceil(chunks / programs)
    programs = math.ceil(chunks / per_program)
    slots = SMS * resident
    waves = math.ceil(batch * programs / slots)
    work = batch * (chunks + programs * TAIL_CHUNKS)  # in chunk reads
    capacity = waves * slots * (per_program + TAIL_CHUNKS)
    time = LATENCY + capacity * chunk_bytes / BANDWIDTH
    return LaunchPlan(programs, per_program, waves, work / capacity, time)


def best_plan(batch: int, chunks: int, resident: int, chunk_bytes: int) -> LaunchPlan:
    """The plan of least predicted time over every distinct P; of equal times, the busiest (the
    wave model is coarse: a fuller machine is the safer bet), then the one with fewer programs."""
    candidates = {math.ceil(chunks / per) for per in range(1, chunks + 1)}
    plans = [plan(batch, chunks, resident, chunk_bytes, p) for p in sorted(candidates)
             if p <= MAX_PROGRAMS_PER_REQUEST]
    return min(plans, key=lambda p: (p.time, -p.busy, p.programs_per_request))


@functools.lru_cache(maxsize=4096)
def launch_plan(batch: int, vocab: int, dtype: torch.dtype, has_draft: bool) -> LaunchPlan:
    resident = slots(dtype, has_draft, vocab) // SMS
    chunk_bytes = CHUNK_SIZE * dtype.itemsize  # p_e only; reading q_e too scales every plan alike
    return best_plan(max(batch, 1), num_chunks(vocab), resident, chunk_bytes)


def programs_per_request(batch: int, vocab: int, dtype: torch.dtype, has_draft: bool) -> int:
    return launch_plan(batch, vocab, dtype, has_draft).programs_per_request
