"""A model of how a launch of a row-pass kernel fills a GPU, and the programs per row it picks.

A row pass streams rows of the vocabulary in 1024-value chunks, each row split over P programs.
A program reads ``chunks_per_program`` chunks, then about one more chunk's worth of fixed work
(re-reading the winning chunk for the inverse CDF, the race keys). ``resident`` programs fit on
each SM at once, from the compiled kernel's registers, shared memory and warps and the device's
limits, so ``SMs * resident`` slots run the ``rows * P`` programs in ``waves``. The model assumes
the memory system is saturated when every slot is busy and each busy slot gets an equal share:

    busy fraction  = (work of all programs) / (waves * slots * duration of the longest program)
    predicted time = LATENCY + (bytes of all programs) / BANDWIDTH / busy fraction

``best_plan`` picks the P (tokens do not depend on it) with the least predicted time. The choice
does not depend on LATENCY or BANDWIDTH, which only set the predicted time; docs/internals/kernel.md
explains the model and tests/test_launch.py checks that it has no cliffs.
"""

from __future__ import annotations

import functools
import math
from typing import NamedTuple

# Registers are given to a warp in blocks of 256 (every NVIDIA GPU since Maxwell).
REGISTER_ALLOCATION_UNIT = 256
# The model's two time constants, to calibrate on a GPU: the launch and the dependent gathers
# before the row pass (what a call costs at any size), and the bandwidth the row pass streams at.
LATENCY = 5e-6
BANDWIDTH = 4.8e12  # bytes/s
# Fixed work of a program beyond its chunks, in chunk reads: the winning chunk read again (from
# L2, just read) and the race keys of its chunks. An estimate, to be calibrated on a GPU.
TAIL_CHUNKS = 0.5
# The work fills the machine when there are at least this many chunk reads per program slot: with
# fewer, a whole number of chunks per program cannot spread evenly (docs/internals/kernel.md).
FILL_CHUNKS_PER_SLOT = 10


class Device(NamedTuple):
    """What the model needs of a GPU."""

    sms: int
    registers_per_sm: int
    shared_per_sm: int  # bytes
    threads_per_sm: int | None  # None where the driver does not say


@functools.lru_cache(maxsize=16)
def device(index: int) -> Device:
    """GPU ``index`` as the model needs it, from torch's device properties; where torch has no CUDA
    (tests/standin_driver.py runs Triton's launch path without a GPU), from the Triton
    driver's, as Triton's fused-softmax tutorial reads them (a block may take an SM's registers
    on NVIDIA GPUs since Maxwell, and all but about 1 KB of its shared memory)."""
    import torch

    if torch.cuda.is_available():
        gpu = torch.cuda.get_device_properties(index)
        return Device(gpu.multi_processor_count, gpu.regs_per_multiprocessor,
                      gpu.shared_memory_per_multiprocessor, gpu.max_threads_per_multi_processor)
    import triton

    properties = triton.runtime.driver.active.utils.get_device_properties(index)
    return Device(properties["multiprocessor_count"], properties["max_num_regs"],
                  properties["max_shared_mem"], None)


def resident_programs(registers: int, num_warps: int, shared: int, gpu: Device) -> int:
    """Programs of ``num_warps`` warps, ``registers`` registers per thread and ``shared`` bytes
    of shared memory that fit on one SM at once (at least 1)."""
    per_warp = math.ceil(max(registers, 1) * 32 / REGISTER_ALLOCATION_UNIT)
    limits = [gpu.registers_per_sm // (per_warp * REGISTER_ALLOCATION_UNIT * num_warps)]
    if shared:
        limits.append(gpu.shared_per_sm // shared)
    if gpu.threads_per_sm:
        limits.append(gpu.threads_per_sm // (num_warps * 32))
    return max(1, min(limits))


class LaunchPlan(NamedTuple):
    programs_per_row: int
    chunks_per_program: int
    waves: int
    busy: float  # predicted fraction of the machine's slots busy over the launch
    time: float  # predicted seconds


def plan(rows: int, chunks: int, slots: int, chunk_bytes: int, programs: int) -> LaunchPlan:
    """The model's prediction for ``programs`` programs per row (rounded so each program has
    ``chunks_per_program`` chunks and none has none), on ``slots`` program slots."""
    per_program = math.ceil(chunks / programs)
    programs = math.ceil(chunks / per_program)
    waves = math.ceil(rows * programs / slots)
    work = rows * (chunks + programs * TAIL_CHUNKS)  # in chunk reads
    capacity = waves * slots * (per_program + TAIL_CHUNKS)
    time = LATENCY + capacity * chunk_bytes / BANDWIDTH
    return LaunchPlan(programs, per_program, waves, work / capacity, time)


@functools.lru_cache(maxsize=4096)
def best_plan(rows: int, chunks: int, slots: int, chunk_bytes: int,
              max_programs: int) -> LaunchPlan:
    """The plan of least predicted time over every distinct P up to ``max_programs``; of equal
    times, the busiest (the wave model is coarse: a fuller machine is the safer bet), then the one
    with fewer programs."""
    rows = max(rows, 1)
    candidates = {math.ceil(chunks / per) for per in range(1, chunks + 1)}
    plans = [plan(rows, chunks, slots, chunk_bytes, p) for p in sorted(candidates)
             if p <= max_programs]
    return min(plans, key=lambda p: (p.time, -p.busy, p.programs_per_row))


def row_split(compiled, rows: int, chunks: int, chunk_bytes: int, max_programs: int,
              programs: int | None = None) -> tuple[int, int]:
    """(programs per row, chunks per program) of a launch of the kernel ``compiled`` describes (a
    ``launcher.Resources``) over ``rows`` rows of ``chunks`` chunks on its device: ``programs``
    where given (tests show tokens do not depend on it), else the model's choice, or 1 where there
    is no compiled kernel (the interpreter, which runs every program in turn); at most
    ``max_programs``, and rounded so that every program has a chunk."""
    if programs is not None or compiled is None:
        return _rounded(chunks, 1 if programs is None else programs, max_programs)
    return _model_split(compiled.registers, compiled.num_warps, compiled.shared, compiled.device,
                        rows, chunks, chunk_bytes, max_programs)


def programs_per_row(compiled, rows: int, chunks: int, chunk_bytes: int,
                     max_programs: int) -> int:
    """The model's programs per row for a launch of the kernel ``compiled`` describes
    (``row_split``'s first value)."""
    return row_split(compiled, rows, chunks, chunk_bytes, max_programs)[0]


def _rounded(chunks: int, programs: int, max_programs: int) -> tuple[int, int]:
    per_program = -(-chunks // max(1, min(programs, chunks, max_programs)))
    return -(-chunks // per_program), per_program  # math.ceil and triton.cdiv are slower


@functools.lru_cache(maxsize=4096)
def _model_split(registers, num_warps, shared, device_index, rows, chunks, chunk_bytes,
                 max_programs) -> tuple[int, int]:
    gpu = device(device_index)
    resident = resident_programs(registers, num_warps, shared, gpu)
    programs = best_plan(rows, chunks, gpu.sms * resident, chunk_bytes,
                         max_programs).programs_per_row
    return _rounded(chunks, programs, max_programs)
