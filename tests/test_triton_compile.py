"""Ahead-of-time compilation of the Triton kernels for Hopper (sm_90), no GPU needed.

The interpreter accepts code the compiler rejects (globals that are not constexpr, unsupported
dtypes, ...), so CI also compiles every specialisation the launcher can produce and reads the
result: the row pass must use 16-byte global loads (``ld.global.v4``) and nothing may spill to
local memory.  The compilation runs in subprocesses without ``TRITON_INTERPRET`` (under the
interpreter ``@triton.jit`` builds interpreter objects that cannot be compiled).

What the launcher varies (compile-time): the probability dtype, the id dtype, each counter's
dtype, draft_probs given or None, split or not (scratch pointers and SPLIT), BLOCK_N (=
next_pow2(N + 1)), and the 16-divisibility of V and the row strides that Triton infers.  Seed and
offset layouts (1 or B elements) and the other strides are runtime arguments (do_not_specialize).
"""

from __future__ import annotations

import itertools
import json
import os
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor

import pytest

triton = pytest.importorskip("triton")

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

PROB_DTYPES = ("fp32", "fp16", "bf16")
INDEX_DTYPES = ("i32", "i64")


def all_specialisations():
    """Every compile-time variant of the main kernel the launcher produces for aligned shapes,
    plus unaligned V and every BLOCK_N up to N = 15 on one dtype combination."""
    specs = []
    for i, (prob, ids, acc, emit, draft, split) in enumerate(itertools.product(
            PROB_DTYPES, INDEX_DTYPES, INDEX_DTYPES, INDEX_DTYPES, (True, False), (True, False))):
        specs.append(dict(prob=prob, ids=ids, acc=acc, emit=emit, draft=draft, split=split,
                          block_n=(2, 8)[i % 2], aligned=True))
    for block_n in (4, 16):
        specs.append(dict(prob="bf16", ids="i64", acc="i32", emit="i32", draft=True, split=True,
                          block_n=block_n, aligned=True))
    for prob, draft in itertools.product(PROB_DTYPES, (True, False)):
        specs.append(dict(prob=prob, ids="i64", acc="i32", emit="i32", draft=draft, split=False,
                          block_n=4, aligned=False))
    return specs


WORKER = r'''
import json, os, re, subprocess, sys, inspect
import triton
from triton.compiler import ASTSource
from triton.backends.compiler import GPUTarget
from specops.chain.launch import (
    LAUNCH_OPTIONS, COMBINE_LAUNCH_OPTIONS, MAX_SPLITS, chain_speculative_sampling_kernel as KERNEL,
    chain_speculative_sampling_combine_kernel as COMBINE)

TARGET = GPUTarget("cuda", 90, 32)
D16 = [["tt.divisibility", 16]]
ROW_INTS = ("vocab", "stride_tb", "stride_tn", "stride_db", "stride_dn")


def cuobjdump():
    here = os.path.join(os.path.dirname(triton.__file__), "backends", "nvidia", "bin", "cuobjdump")
    return os.environ.get("TRITON_CUOBJDUMP_PATH", here)


def resources(cubin):
    path = "/tmp/specops_%d.cubin" % os.getpid()
    with open(path, "wb") as f:
        f.write(cubin)
    try:
        text = subprocess.run([cuobjdump(), "--dump-resource-usage", path], capture_output=True,
                              text=True, check=True).stdout
    except (OSError, subprocess.CalledProcessError):
        return None
    found = {k: int(v) for k, v in re.findall(r"(REG|STACK|LOCAL):(\d+)", text)}
    sass = subprocess.run([cuobjdump(), "-sass", path], capture_output=True, text=True).stdout
    found["STL"] = len(re.findall(r"\bSTL\b", sass))
    found["LDL"] = len(re.findall(r"\bLDL\b", sass))
    found["CALL"] = len(re.findall(r"\bCALL\b", sass))
    return found


def compile_one(fn, types, constexprs, divisible):
    signature, attrs = {}, {}
    for i, name in enumerate(fn.arg_names):
        signature[name] = "constexpr" if name in constexprs else types.get(name, "i32")
        if name in divisible:
            attrs[(i,)] = D16
    options = LAUNCH_OPTIONS if fn is KERNEL else COMBINE_LAUNCH_OPTIONS  # as the launcher
    kernel = triton.compile(ASTSource(fn, signature, constexprs, attrs), target=TARGET,
                            options=options)
    ptx = kernel.asm["ptx"]
    return {
        "v4_loads": [l.strip() for l in ptx.splitlines() if "ld.global.v4" in l],
        "local_in_ptx": bool(re.search(r"\.local|ld\.local|st\.local", ptx)),
        "resources": resources(kernel.asm["cubin"]),
    }


def main_kernel(spec):
    prob, split = spec["prob"], spec["split"]
    types = {"target_ptr": "*" + prob, "draft_ptr": "*" + prob, "ids_ptr": "*" + spec["ids"],
             "accepted_ptr": "*" + spec["acc"], "emitted_ptr": "*" + spec["emit"],
             "seed_ptr": "*i64", "offset_ptr": "*i64", "out_ptr": "*i32",
             # the launcher passes the int32 output as the unused scratch when not split
             "split_key_ptr": "*fp64" if split else "*i32", "split_token_ptr": "*i32",
             "split_e_ptr": "*i32"}
    constexprs = {"HAS_DRAFT": spec["draft"], "SPLIT": split, "BLOCK_N": spec["block_n"],
                  "CHUNK": 1024}
    divisible = {n for n in KERNEL.arg_names if n.endswith("_ptr")}
    if spec["aligned"]:
        divisible |= set(ROW_INTS)
    return compile_one(KERNEL, types, constexprs, divisible)


def combine_kernel():
    types = {"split_key_ptr": "*fp64", "split_token_ptr": "*i32", "split_e_ptr": "*i32",
             "out_ptr": "*i32"}
    divisible = {n for n in COMBINE.arg_names if n.endswith("_ptr")}
    return compile_one(COMBINE, types, {"BLOCK_S": MAX_SPLITS}, divisible)


if "constexprs" not in inspect.signature(ASTSource.__init__).parameters:
    print(json.dumps({"skip": "ASTSource API of triton < 3.3"}))
    sys.exit(0)
results = [main_kernel(spec) for spec in json.loads(sys.argv[1])]
if len(sys.argv) > 2:
    results.append(combine_kernel())
print(json.dumps(results))
'''


def run_worker(specs, with_combine):
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    env["PYTHONPATH"] = ROOT + os.pathsep + env.get("PYTHONPATH", "")
    args = [sys.executable, "-c", WORKER, json.dumps(specs)] + (["combine"] if with_combine else [])
    proc = subprocess.run(args, capture_output=True, text=True, env=env, cwd=ROOT, timeout=900)
    assert proc.returncode == 0, proc.stderr[-4000:]
    return json.loads(proc.stdout.strip().splitlines()[-1])


@pytest.fixture(scope="module")
def compiled():
    specs = all_specialisations()
    workers = max(1, min(4, os.cpu_count() or 1))
    shards = [specs[i::workers] for i in range(workers)]
    with ThreadPoolExecutor(workers) as pool:
        outs = list(pool.map(lambda i: run_worker(shards[i], i == 0), range(workers)))
    if any(isinstance(o, dict) and "skip" in o for o in outs):
        pytest.skip(outs[0]["skip"])
    results = {}
    for i, (shard, out) in enumerate(zip(shards, outs)):
        if i == 0:
            results["combine"] = out.pop()
        for spec, res in zip(shard, out):
            results[json.dumps(spec, sort_keys=True)] = (spec, res)
    return results


def test_every_specialisation_compiles_without_spills(compiled):
    assert len(compiled) == len(all_specialisations()) + 1
    for key, value in compiled.items():
        res = value if key == "combine" else value[1]
        assert not res["local_in_ptx"], key
        if res["resources"] is not None:  # cuobjdump ships with triton's NVIDIA backend
            r = res["resources"]
            # Nothing in local memory: no local arrays, no stack frame, no spill stores or loads.
            assert r.get("LOCAL", 0) == 0 and r["REG"] <= 255, (key, r)
            assert r.get("STACK", 0) == 0 and r["STL"] == 0 and r["LDL"] == 0, (key, r)


def test_row_pass_uses_16_byte_loads(compiled):
    for key, value in compiled.items():
        if key == "combine":
            continue
        spec, res = value
        if not spec["aligned"]:
            continue  # V % 16 != 0: rows are not 16-byte aligned, so no vector loads
        # 1024 values over 128 threads: 8 per thread = 2 (fp32) or 1 (fp16/bf16) 16-byte loads
        # per row per chunk, for the prefetch prologue and the loop; twice with the draft row.
        per_row = 2 if spec["prob"] == "fp32" else 1
        expected = per_row * 2 * (2 if spec["draft"] else 1)
        assert len(res["v4_loads"]) == expected, (spec, res["v4_loads"])
