"""Kernels compiled for sm_90 without a GPU, and what their PTX and SASS say: registers, local
memory, spills, each row loop's loads and instructions, and the instruction budget of the row
loops (the bytes per second an H200 could stream on instruction issue alone).

A row pass streams 1024-value chunks; on an H200 an SM issues at most 4 warp-instructions per
cycle, so a loop that spends I warp-instructions per byte cannot go faster than
132 SMs * 4 * 1.98 GHz / I bytes/s, whatever the memory does. ``compile_*`` compile a kernel
variant for GPUTarget("cuda", 90, 32) with its launcher's own options; ``compile_report`` and
``budget`` read it (nvdisasm and cuobjdump ship with Triton's NVIDIA backend): each row loop is an
innermost loop of masses_p / masses_residual, the row stages every kernel takes from
specops/core/sampling/race_triton.py.

Chain variants: with draft_probs, the rejected-draft case reads q_e too (the residual loop, twice
the bytes per chunk); without a residual to read, or with draft_probs None, only p_e (the p loop).
Block variants: a row where the draft runs reads q_t too (the residual loop); with draft_probs None
it reads p_t alone, weighted by w_t when w_t < 1 (the scaled loop); a row where the draft has ended,
or w_t = 1 without draft_probs, reads p_t (the p loop). Tree variants: a rejection's pass reads
a node's p and q rows (the residual loop); a leaf's draw, or target-only any node's, reads p (the
p loop).

The compile tests (tests/test_triton_compile.py, test_block_compile.py, test_tree_compile.py)
check every variant with these functions; benchmarks/sass_budget.py prints the tables.
"""

from __future__ import annotations

import functools
import inspect
import linecache
import os
import re
import subprocess
import sys
import tempfile

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))  # the checkout
if ROOT not in sys.path:
    sys.path.insert(0, ROOT)

SMS = 132
ISSUE_PER_CYCLE = 4  # warp-instructions per cycle per SM (4 schedulers)
CLOCK_HZ = 1.98e9
HBM_BYTES_PER_S = 4.8e12
GOAL_BYTES_PER_S = 1.25 * HBM_BYTES_PER_S  # issue must never be what limits the row pass
PROB_DTYPES = {"fp32": 4, "fp16": 2, "bf16": 2}  # name -> bytes per value
CHUNK = 1024


def issue_bound(instructions_per_byte: float) -> float:
    """Bytes/s an H200 can stream when every byte costs that many warp-instructions."""
    return SMS * ISSUE_PER_CYCLE * CLOCK_HZ / instructions_per_byte


def tool(name: str) -> str:
    import triton

    return os.path.join(os.path.dirname(triton.__file__), "backends", "nvidia", "bin", name)


def compile_for_hopper(kernel, types, constexprs, aligned=True, options=None):
    """triton.compile of ``kernel`` for sm_90 (no GPU needed) as its launcher specialises it:
    arguments typed by ``types`` (i32 when not named), and with ``aligned`` the 16-divisibility of
    every argument the kernel specialises on (those not in its do_not_specialize list)."""
    import triton
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    signature, attrs = {}, {}
    for i, param in enumerate(kernel.params):
        name = param.name
        signature[name] = "constexpr" if name in constexprs else types.get(name, "i32")
        if aligned and not param.do_not_specialize and name not in constexprs:
            attrs[(i,)] = [["tt.divisibility", 16]]
    return triton.compile(ASTSource(kernel, signature, constexprs, attrs),
                          target=GPUTarget("cuda", 90, 32), options=options)


# Rule step 0's arguments (core/sampling/step_triton.py) as the launchers pass them: float32
# bias, int32 bitmask and counts, a bool prompt mask, float64 penalties.
STEP_TYPES = {"bias_ptr": "*fp32", "bitmask_ptr": "*i32", "counts_ptr": "*i32",
              "prompt_ptr": "*i1", "penalties_ptr": "*fp64"}
EVERY_STEP_PART = 15  # bias, mask, penalties and prompt mask: step_triton.py's flags summed
# What step 0 reads per value besides the logits, each input's bytes a value: with every part, a
# float32 bias, an int32 count, a bool prompt mask and a bitmask bit; the bias alone.
EVERY_STEP_INPUTS = (4, 4, 1, 1 / 8)
BIAS_INPUTS = (4,)

def compile_main(prob, draft, ids="i64", acc="i32", emit="i32", block_n=8, aligned=True,
                 logits=False, draft_logits=False, varlen=False, step=0):
    """The token-verification kernel as the launcher would specialise it (``logits``: reading
    logits through their rows' statistics; ``draft_logits``: the draft's too; ``varlen``: a
    flattened batch's rows; ``step``: rule step 0's flags)."""
    from specops.chain.token.kernel import chain_speculative_sampling_kernel
    from specops.chain.token import launch

    types = {"target_ptr": "*" + prob, "draft_ptr": "*" + prob, "ids_ptr": "*" + ids,
             "accepted_ptr": "*" + acc, "emitted_ptr": "*" + emit, "seed_ptr": "*i64",
             "offset_ptr": "*i64", "out_ptr": "*i32", "partials_ptr": "*fp64",
             "arrivals_ptr": "*i32", "target_stats_ptr": "*fp64", "draft_stats_ptr": "*fp64",
             "cu_ptr": "*i64", **STEP_TYPES}
    constexprs = {"HAS_DRAFT": draft, "BLOCK_N": block_n, "GROUP": launch.GROUP, "CHUNK": CHUNK,
                  "LOGITS": logits, "DRAFT_LOGITS": draft_logits,
                  "BLOCK_P": launch.MAX_PROGRAMS_PER_REQUEST, "VARLEN": varlen, "STEP": step}
    return compile_for_hopper(chain_speculative_sampling_kernel, types, constexprs, aligned,
                              (launch.MAIN_STEP if step else launch.MAIN_FROM_LOGITS if logits
                               else launch.MAIN_FLATTENED if varlen else launch.MAIN).options)


def compile_block_row_pass(prob, draft, ids="i64", aligned=True, logits=False,
                           draft_logits=False, varlen=False, step=0):
    """The block-verification row pass as its launcher would specialise it (``logits``,
    ``draft_logits``, ``varlen``: as for compile_main)."""
    from specops.chain.block.kernel import block_row_pass_kernel
    from specops.chain.block import launch

    types = {"target_ptr": "*" + prob, "draft_ptr": "*" + prob, "ids_ptr": "*" + ids,
             "seed_ptr": "*i64", "offset_ptr": "*i64", "partials_ptr": "*fp64",
             "masses_ptr": "*fp32", "target_stats_ptr": "*fp64", "draft_stats_ptr": "*fp64",
             "cu_ptr": "*i64", **STEP_TYPES}
    constexprs = {"HAS_DRAFT": draft, "GROUP": launch.GROUP, "CHUNK": CHUNK, "LOGITS": logits,
                  "DRAFT_LOGITS": draft_logits, "VARLEN": varlen, "STEP": step}
    return compile_for_hopper(block_row_pass_kernel, types, constexprs, aligned,
                              (launch.ROW_PASS_STEP if step else launch.ROW_PASS_FROM_LOGITS
                               if logits else launch.ROW_PASS).options)


def _tree_constexprs(logits, draft_logits, step):
    """A tree launcher's constexprs and kernel choice from logits (tree/launch.py)."""
    from specops.core.sampling.values_triton import ONE_HOT

    return {"LOGITS": ONE_HOT.value if logits else 0,
            "DRAFT_LOGITS": ONE_HOT.value if draft_logits else 0, "STEP": step}


def _tree_types(prob, ids, parents):
    return {"target_ptr": "*" + prob, "draft_ptr": "*" + prob, "ids_ptr": "*" + ids,
            "parents_ptr": "*" + parents, "seed_ptr": "*i64", "offset_ptr": "*i64",
            "out_tokens_ptr": "*i32", "out_nodes_ptr": "*i32", "emitted_ptr": "*i32",
            "target_stats_ptr": "*fp64", "draft_stats_ptr": "*fp64", "paths_ptr": "*i64",
            **STEP_TYPES}


def compile_tree(prob, draft, ids="i64", parents="i64", block_m=16, aligned=True, logits=False,
                 draft_logits=False, step=0):
    """The tree kernel as its launcher would specialise it (``logits``: reading logits through
    their rows' statistics; ``draft_logits``: the draft's too; ``step``: rule step 0's flags)."""
    from specops.tree import launch

    constexprs = {"HAS_DRAFT": draft, "BLOCK_M": block_m, "GROUP": launch.GROUP, "CHUNK": CHUNK,
                  **_tree_constexprs(logits, draft_logits, step)}
    kernel = (launch.KERNEL_STEP if step else launch.KERNEL_FROM_LOGITS if logits else
              launch.KERNEL)
    return compile_for_hopper(kernel.fn, _tree_types(prob, ids, parents), constexprs, aligned,
                              kernel.options)


def compile_traversal(prob, draft=True, ids="i64", parents="i64", block_m=16, aligned=True,
                      logits=False, draft_logits=False, step=0):
    """The traversal kernel as its launcher would specialise it (it always reads draft rows;
    ``logits``, ``draft_logits``, ``step``: as for compile_tree)."""
    from specops.tree import launch

    constexprs = {"BLOCK_M": block_m, "GROUP": launch.GROUP, "CHUNK": CHUNK,
                  **_tree_constexprs(logits, draft_logits, step)}
    kernel = (launch.TRAVERSAL_STEP if step else launch.TRAVERSAL_FROM_LOGITS if logits else
              launch.TRAVERSAL)
    return compile_for_hopper(kernel.fn, _tree_types(prob, ids, parents), constexprs, aligned,
                              kernel.options)


@functools.lru_cache(maxsize=8)  # a kernel's report and its budget read the same listing
def disassemble(cubin: bytes) -> list[tuple[str, str, tuple[tuple[str, int], ...]]]:
    """(label or '', instruction text, (source file, line) of it, innermost first, over its chain
    of inlined calls) per line of SASS; labels come as ('.L_x_3', '', ())."""
    with tempfile.NamedTemporaryFile(suffix=".cubin") as f:
        f.write(cubin)
        f.flush()
        text = subprocess.run([tool("nvdisasm"), "-c", "-gi", f.name], capture_output=True,
                              text=True, check=True).stdout
    rows, lines, after_comment = [], (), False
    for raw in text.splitlines():
        if raw.lstrip().startswith("//## File"):  # one instruction's inlining chain, over lines
            found = tuple((source_file(path), int(line))
                          for path, line in re.findall(r'"([^"]+)", line (\d+)', raw))
            lines = lines + found if after_comment else found
            after_comment = True
            continue
        after_comment = False
        if re.match(r"^\.L_x_\d+:", raw.strip()):
            rows.append((raw.strip()[:-1], "", ()))
        else:
            m = re.match(r"\s*/\*[0-9a-f]+\*/\s+(.*?)\s*;", raw)
            if m:
                rows.append(("", m.group(1), lines))
    return rows


def resources(cubin: bytes) -> dict[str, int]:
    """REG, SHARED, STACK, LOCAL of the kernel (cuobjdump --dump-resource-usage)."""
    with tempfile.NamedTemporaryFile(suffix=".cubin") as f:
        f.write(cubin)
        f.flush()
        text = subprocess.run([tool("cuobjdump"), "--dump-resource-usage", f.name],
                              capture_output=True, text=True, check=True).stdout
    return {k: int(v) for k, v in re.findall(r"(REG|SHARED|STACK|LOCAL):(\d+)", text)}


def innermost_loops(rows):
    """[(first, last)] row indices of loops: a branch back to a label, with no loop inside."""
    where = {label: i for i, (label, _, _) in enumerate(rows) if label}
    loops = []
    for i, (_, text, _) in enumerate(rows):
        m = re.search(r"\bBRA\b.*`\((\.L_x_\d+)\)", text)
        if m and where.get(m.group(1), i) < i:
            loops.append((where[m.group(1)], i))
    return [(a, b) for a, b in loops
            if not any(a < c and d <= b for c, d in loops if (c, d) != (a, b))]


def source_file(path: str) -> str:
    """A source file as its last three path parts (specops/core/sampling/race_triton.py): Triton's cache
    may hand back a kernel compiled from another checkout of the same source, whose line table
    names that checkout's files."""
    return "/".join(os.path.realpath(path).split(os.sep)[-3:])


def source_lines(fn) -> set[tuple[str, int]]:
    """(file, line) of every source line of a @triton.jit function, files as source_file."""
    lines, first = inspect.getsourcelines(fn.fn)
    path = source_file(inspect.getsourcefile(fn.fn))
    return {(path, first + i) for i in range(len(lines))}


def row_loop_markers() -> dict[str, list[set[tuple[str, int]]]]:
    """Loop name -> the source lines that mark it, for each row loop (both samplers' row passes
    share them, in specops/core/sampling/race_triton.py). masses_p compiles to two loops where its SCALED
    is used both ways (the block row pass), told apart by its chunk step's weighting line."""
    from specops.core.sampling.race_triton import _p_values, masses_p, masses_residual

    source = inspect.getsourcefile(_p_values.fn)
    weighting = {(path, line) for path, line in source_lines(_p_values)
                 if linecache.getline(source, line).strip() == "p = w_row * p"}
    assert len(weighting) == 1, "the weighting line of masses_p's chunk step not found"
    p_lines = source_lines(masses_p)
    return {"p": [p_lines], "residual": [source_lines(masses_residual)],
            "scaled": [p_lines, weighting]}


def opcode(text: str) -> str:
    """An instruction's opcode with its modifiers (LDG.E.128), past any predicate (@P0)."""
    return text.split()[1] if text.startswith("@") else text.split()[0]


def is_16_byte_load(op: str) -> bool:
    """A 16-byte global load, whatever other modifiers a ptxas adds (LDG.E.128,
    LDG.E.128.CONSTANT, LDG.E.EL.128)."""
    parts = op.split(".")
    return parts[0] == "LDG" and "128" in parts[1:]


@functools.lru_cache(maxsize=1)
def step_load_lines() -> set[tuple[str, int]]:
    """(file, line) of rule step 0's loads in a chunk read (step_triton.py's ``adjusted`` and
    ``adjusted_row``: the bias, mask, counts, prompt mask and draft ids)."""
    from specops.core.sampling.step_triton import adjusted, adjusted_row

    source = inspect.getsourcefile(adjusted.fn)
    return {(path, line) for fn in (adjusted, adjusted_row) for path, line in source_lines(fn)
            if "tl.load(" in linecache.getline(source, line)}


def is_step_load(lines) -> bool:
    """Whether a load comes from rule step 0: its innermost source line one of its loads' (a
    compiler may place a row's own load on another line of step_triton.py, where it is used)."""
    return bool(lines) and lines[0] in step_load_lines()


@functools.lru_cache(maxsize=1)
def draft_hit_lines() -> frozenset[tuple[str, int]]:
    """(file, line) of step 0's tests of whether a draft falls in the chunk (adjusted_row's,
    unrolled and looped)."""
    from specops.core.sampling.step_triton import adjusted_row

    source = inspect.getsourcefile(adjusted_row.fn)
    found = frozenset((path, line) for path, line in source_lines(adjusted_row)
                      if linecache.getline(source, line).strip().startswith("if (d >= start)"))
    assert len(found) == 2, "adjusted_row's tests of a draft in the chunk not found"
    return found


def every_chunk(rows, first: int, last: int) -> list[tuple[str, tuple]]:
    """(text, lines) of the instructions of the loop rows[first:last + 1] that every iteration
    may run: all but a draft's count in a chunk it falls in (the code a branch at step 0's hit
    test skips), which runs in at most one chunk of a row per draft."""
    where = {label: i for i, (label, _, _) in enumerate(rows) if label}
    hits, body, skip_to = draft_hit_lines(), [], None
    for i in range(first, last + 1):
        label, text, lines = rows[i]
        if skip_to is not None and i < skip_to:
            continue
        skip_to = None
        if not text:
            continue
        body.append((text, lines))
        m = re.search(r"\bBRA\b.*`\((\.L_x_\d+)\)", text)
        if m and text.startswith("@") and lines and lines[0] in hits and where[m.group(1)] > i:
            skip_to = where[m.group(1)]
    return body


def row_loops(kernel) -> dict[str, dict]:
    """The row loops of a compiled kernel, by the function they come from: instructions per
    iteration (``every_chunk``'s), 16-byte loads of the rows per iteration (``loads16``; rule step
    0's loads apart: ``step_loads``, its 16-byte and other loads), and the opcodes."""
    markers = row_loop_markers()
    rows = disassemble(kernel.asm["cubin"])
    found = {}
    for first, last in innermost_loops(rows):
        body = [(text, lines) for _, text, lines in rows[first:last + 1] if text]
        touched = {line for _, lines in body for line in lines}
        # The most specific name whose every marking set the loop touches.
        names = [name for name, sets in markers.items()
                 if all(touched.intersection(lines) for lines in sets)]
        if names:
            name = max(names, key=lambda n: len(markers[n]))
            rows_ops = [opcode(t) for t, lines in body if not is_step_load(lines)]
            step_ops = [opcode(t) for t, lines in body
                        if is_step_load(lines) and opcode(t).startswith("LDG")]
            found[name] = {"instructions": len(every_chunk(rows, first, last)),
                           "opcodes": rows_ops,
                           "all_loads16": sum(is_16_byte_load(opcode(t)) for t, _ in body),
                           "loads16": sum(map(is_16_byte_load, rows_ops)),
                           "step_loads": {"loads16": sum(map(is_16_byte_load, step_ops)),
                                          "other": len(step_ops) - sum(map(is_16_byte_load,
                                                                            step_ops))}}
    return found


def compile_report(kernel, with_row_loops: bool = False) -> dict:
    """What the compile tests check of a compiled kernel: local memory in the PTX, its resources
    (cuobjdump), spill instructions and, ``with_row_loops``, each row loop's 16-byte and other
    global loads (nvdisasm; both ship with Triton's NVIDIA backend)."""
    found = {"local_in_ptx": bool(re.search(r"\.local|ld\.local|st\.local", kernel.asm["ptx"])),
             "num_warps": kernel.metadata.num_warps,
             "resources": resources(kernel.asm["cubin"])}
    opcodes = [opcode(text) for _, text, _ in disassemble(kernel.asm["cubin"]) if text]
    found["spills"] = sum(op.startswith(("STL", "LDL")) for op in opcodes)
    if with_row_loops:
        found["row_loops"] = {name: {"loads16": loop["loads16"],
                                     "all_loads16": loop["all_loads16"], "other_loads": sum(
            op.startswith("LDG") and not is_16_byte_load(op) for op in loop["opcodes"]),
            "step_loads": loop["step_loads"]} for name, loop in row_loops(kernel).items()}
    return found


LOOP_LABELS = {"p": "p only", "residual": "residual read", "scaled": "w p only"}


def budget(prob: str, draft: bool, kernel=None, sampler: str = "chain", label: str = "",
           step_inputs: tuple = ()) -> list[dict]:
    """One row per row loop of the variant: instructions per chunk (per warp), bytes per chunk,
    instructions per byte (all warps of a program) and the issue-bound bandwidth.
    ``step_inputs``: what rule step 0 reads besides the rows (EVERY_STEP_INPUTS, BIAS_INPUTS)."""
    kernel = kernel or COMPILERS[sampler](prob, draft)
    num_warps = kernel.metadata.num_warps
    elem = PROB_DTYPES[prob]
    return [budget_row(f"{prob}{label} draft={'given' if draft else 'None'} {LOOP_LABELS[name]}",
                       loop["instructions"], loop["all_loads16"],
                       2 if name == "residual" else 1, elem, num_warps, step_inputs)
            for name, loop in sorted(row_loops(kernel).items())]


def loads16_per_chunk(rows_read: int, elem: int, num_warps: int, step_inputs: tuple = ()) -> int:
    """16-byte loads a chunk takes per thread: each row's, and each step 0 input's wide enough
    (bytes a value times values a thread) to be read 16 bytes at a time."""
    values = CHUNK // (32 * num_warps)  # a thread's
    return rows_read * values * elem // 16 + sum(int(w * values) // 16 for w in step_inputs)


def budget_row(variant: str, instructions: int, all_loads16: int, rows_read: int, elem: int,
               num_warps: int, step_inputs: tuple = ()) -> dict:
    """A loop's budget row from its instructions and all its 16-byte loads per iteration (how
    many chunks an iteration reads, whichever source line a compiler gives each load):
    instructions per chunk (per warp), bytes per chunk (the rows' and step 0's inputs'),
    instructions per byte (all warps of a program) and the issue-bound bandwidth."""
    chunks = all_loads16 / loads16_per_chunk(rows_read, elem, num_warps, step_inputs)
    per_chunk = instructions / chunks
    chunk_bytes = rows_read * CHUNK * elem + CHUNK * sum(step_inputs)
    per_byte = per_chunk * num_warps / chunk_bytes
    return {"variant": variant, "instructions_per_chunk": per_chunk,
            "chunks_per_iteration": chunks, "bytes_per_chunk": chunk_bytes,
            "instructions_per_byte": per_byte, "issue_bound": issue_bound(per_byte)}


COMPILERS = {"chain": compile_main, "block": compile_block_row_pass, "tree": compile_tree,
             "traversal": compile_traversal}


def compile_statistics(prob, varlen=False, step=0, entropy=False):
    """The row statistics kernel (verification from logits' first stage) as its launcher
    specialises it (``varlen``: a flattened batch's rows; ``step``: rule step 0's flags;
    ``entropy``: each row's entropy too, as the logprobs op asks for typical acceptance)."""
    from specops.core.logits.launch import statistics_kernel
    from specops.core.logits.triton import row_statistics_kernel

    types = {"logits_ptr": "*" + prob, "stats_ptr": "*fp64", "temperature_ptr": "*fp32",
             "top_k_ptr": "*i64", "top_p_ptr": "*fp32", "min_p_ptr": "*fp32", "cu_ptr": "*i64",
             "ids_ptr": "*i64", "entropy_ptr": "*fp32" if entropy else "*fp64", **STEP_TYPES}
    return compile_for_hopper(row_statistics_kernel, types,
                              {"CHUNK": CHUNK, "VARLEN": varlen, "STEP": step,
                               "ENTROPY": entropy}, True, statistics_kernel(step).options)


def statistics_budget(prob: str, kernel=None, label: str = "", step_inputs: tuple = ()
                      ) -> list[dict]:
    """One row per pass loop of the statistics kernel (each inlined copy of the peak, count and
    mass passes: every pass reads the row once), as ``budget``'s rows."""
    from specops.core.logits.triton import _count, _mass, _peak

    kernel = kernel or compile_statistics(prob)
    num_warps = kernel.metadata.num_warps
    elem = PROB_DTYPES[prob]
    marks = {"peak": source_lines(_peak), "count": source_lines(_count),
             "mass": source_lines(_mass)}
    rows = disassemble(kernel.asm["cubin"])
    out = []
    for first, last in innermost_loops(rows):
        body = [(text, lines) for _, text, lines in rows[first:last + 1] if text]
        loads = sum(is_16_byte_load(opcode(t)) for t, _ in body)
        names = [name for name, lines in marks.items()
                 if {line for _, ls in body for line in ls} & lines]
        if not loads or len(names) != 1:  # not a pass over the row
            continue
        out.append(budget_row(f"{prob}{label} statistics {names[0]} pass",
                              len(every_chunk(rows, first, last)), loads, 1, elem, num_warps,
                              step_inputs))
    return out
