"""A model of how a launch of a row-pass kernel fills an H200, and the programs per row it picks.

A row pass streams rows of the vocabulary in 1024-value chunks, each row split over P programs.
A program reads ``chunks_per_program`` chunks, then about one more chunk's worth of fixed work
(re-reading the winning chunk for the inverse CDF, the race keys).  ``resident`` programs fit on
each SM at once (registers, warps), so ``SMS * resident`` slots run the ``rows * P`` programs in
``waves``.  The model assumes the memory system is saturated when every slot is busy and each busy
slot gets an equal share of it:

    busy fraction  = (work of all programs) / (waves * slots * duration of the longest program)
    predicted time = LATENCY + (bytes of all programs) / BANDWIDTH / busy fraction

``best_plan`` picks the P (tokens do not depend on it) with the least predicted time.  Each
sampler describes its row-pass kernel as a ``RowPass``: its registers per thread (from its compiled
variants) and its most programs per row; docs/kernel.md tabulates the result, tests/test_launch.py
checks it.
"""

from __future__ import annotations

import math
from typing import NamedTuple

from .race import CHUNK_SIZE, num_chunks

# H200 (sm_90): 132 SMs, each 65536 32-bit registers, at most 64 warps, 2048 threads, 32 programs.
SMS = 132
REGISTERS_PER_SM = 65536
MAX_WARPS_PER_SM = 64
MAX_THREADS_PER_SM = 2048
MAX_PROGRAMS_PER_SM = 32
REGISTER_ALLOCATION_UNIT = 256  # registers are given to a warp in blocks of 256
BANDWIDTH = 4.8e12  # bytes/s, HBM3e peak
# Launch, the dependent gathers before the row pass and the second (combining) launch: what a step
# costs at any size.
LATENCY = 5e-6
# Fixed work of a program beyond its chunks, in chunk reads: the winning chunk read again (from
# L2, just read) and the race keys of its chunks. An estimate, to be calibrated on a GPU.
TAIL_CHUNKS = 0.5
# The work fills the machine when there are at least this many chunk reads per program slot: with
# fewer, a whole number of chunks per program cannot spread evenly (docs/kernel.md).
FILL_CHUNKS_PER_SLOT = 10


def resident_programs(registers: int, num_warps: int) -> int:
    """Programs of ``num_warps`` warps that fit on one SM at ``registers`` registers per thread."""
    per_warp = math.ceil(registers * 32 / REGISTER_ALLOCATION_UNIT) * REGISTER_ALLOCATION_UNIT
    return min(REGISTERS_PER_SM // (per_warp * num_warps), MAX_WARPS_PER_SM // num_warps,
               MAX_THREADS_PER_SM // (num_warps * 32), MAX_PROGRAMS_PER_SM)


def machine_programs(registers: int, num_warps: int) -> int:
    """Programs the whole machine holds at once (its slots)."""
    return SMS * resident_programs(registers, num_warps)


class LaunchPlan(NamedTuple):
    programs_per_request: int  # programs per row (a request's row, or a block's candidate row)
    chunks_per_program: int
    waves: int
    busy: float  # predicted fraction of the machine's slots busy over the launch
    time: float  # predicted seconds


def plan(rows: int, chunks: int, resident: int, chunk_bytes: int, programs: int) -> LaunchPlan:
    """The model's prediction for ``programs`` programs per row (rounded so each program has
    ``chunks_per_program`` chunks and none has none)."""
    per_program = math.ceil(chunks / programs)
    programs = math.ceil(chunks / per_program)
    slots = SMS * resident
    waves = math.ceil(rows * programs / slots)
    work = rows * (chunks + programs * TAIL_CHUNKS)  # in chunk reads
    capacity = waves * slots * (per_program + TAIL_CHUNKS)
    time = LATENCY + capacity * chunk_bytes / BANDWIDTH
    return LaunchPlan(programs, per_program, waves, work / capacity, time)


def best_plan(rows: int, chunks: int, resident: int, chunk_bytes: int,
              max_programs: int) -> LaunchPlan:
    """The plan of least predicted time over every distinct P up to ``max_programs``; of equal
    times, the busiest (the wave model is coarse: a fuller machine is the safer bet), then the one
    with fewer programs."""
    candidates = {math.ceil(chunks / per) for per in range(1, chunks + 1)}
    plans = [plan(rows, chunks, resident, chunk_bytes, p) for p in sorted(candidates)
             if p <= max_programs]
    return min(plans, key=lambda p: (p.time, -p.busy, p.programs_per_request))


class RowPass(NamedTuple):
    """A sampler's row-pass kernel as the model sees it."""

    # Registers per thread of its compiled variants, by (probability dtype, draft_probs given,
    # V % 16 == 0: 16-byte row loads, else scalar loads).
    registers: dict
    num_warps: int
    max_programs: int  # most programs per row

    def resident(self, dtype, has_draft: bool, vocab: int) -> int:
        """Programs of the kernel one SM holds at once."""
        return resident_programs(self.registers[(dtype, has_draft, vocab % 16 == 0)],
                                 self.num_warps)

    def programs_held(self, dtype, has_draft: bool, vocab: int) -> int:
        """Programs of the kernel the whole machine holds at once."""
        return machine_programs(self.registers[(dtype, has_draft, vocab % 16 == 0)],
                                self.num_warps)

    def plan(self, rows: int, vocab: int, dtype, has_draft: bool) -> LaunchPlan:
        """The plan for ``rows`` rows of ``vocab`` values. A chunk's bytes are p's alone: reading q
        too scales every plan alike."""
        return best_plan(max(rows, 1), num_chunks(vocab), self.resident(dtype, has_draft, vocab),
                         CHUNK_SIZE * dtype.itemsize, self.max_programs)
