"""Ahead-of-time compilation of the block-verification kernels for Hopper (sm_90), no GPU needed
(the approach of tests/test_triton_compile.py): the row pass must read its rows with 16-byte loads
(``ld.global.v4``) and nothing may spill to local memory. Compiled in a subprocess without
TRITON_INTERPRET (under the interpreter ``@triton.jit`` builds objects that cannot be compiled).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

triton = pytest.importorskip("triton")

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

# (probability dtype, draft_probs given) for the row pass; (dtype, draft, BLOCK_N, BLOCK_S) for the scan.
ROW_SPECS = [(prob, draft) for prob in ("fp32", "fp16", "bf16") for draft in (True, False)]
SCAN_SPECS = [("bf16", True, 4, 1), ("fp32", False, 8, 256), ("fp16", True, 16, 32)]

WORKER = r'''
import inspect, json, os, re, subprocess, sys
import triton
from triton.compiler import ASTSource
from triton.backends.compiler import GPUTarget
from specops.block.launch import LAUNCH_OPTIONS, SCAN_LAUNCH_OPTIONS
from specops.block.kernel import block_row_pass_kernel as ROW, block_scan_kernel as SCAN

TARGET = GPUTarget("cuda", 90, 32)
D16 = [["tt.divisibility", 16]]
ROW_INTS = ("vocab", "stride_tb", "stride_tn", "stride_db", "stride_dn")


def cuobjdump():
    here = os.path.join(os.path.dirname(triton.__file__), "backends", "nvidia", "bin", "cuobjdump")
    return os.environ.get("TRITON_CUOBJDUMP_PATH", here)


def resources(cubin):
    path = "/tmp/specops_block_%d.cubin" % os.getpid()
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
    return found


def compile_one(fn, types, constexprs, options):
    signature, attrs = {}, {}
    for i, name in enumerate(fn.arg_names):
        signature[name] = "constexpr" if name in constexprs else types.get(name, "i32")
        if name.endswith("_ptr") or name in ROW_INTS:
            attrs[(i,)] = D16
    kernel = triton.compile(ASTSource(fn, signature, constexprs, attrs), target=TARGET,
                            options=options)
    ptx = kernel.asm["ptx"]
    return {"v4_loads": [l.strip() for l in ptx.splitlines() if "ld.global.v4" in l],
            "local_in_ptx": bool(re.search(r"\.local|ld\.local|st\.local", ptx)),
            "resources": resources(kernel.asm["cubin"])}


if "constexprs" not in inspect.signature(ASTSource.__init__).parameters:
    print(json.dumps({"skip": "ASTSource API of triton < 3.3"}))
    sys.exit(0)
row_specs, scan_specs = json.loads(sys.argv[1])
out = {"row": [], "scan": []}
for prob, draft in row_specs:
    types = {"target_ptr": "*" + prob, "draft_ptr": "*" + prob, "ids_ptr": "*i64",
             "seed_ptr": "*i64", "offset_ptr": "*i64", "weight_ptr": "*fp64", "mass_ptr": "*fp64",
             "key_ptr": "*fp64", "token_ptr": "*i32"}
    out["row"].append(compile_one(ROW, types, {"HAS_DRAFT": draft, "CHUNK": 1024}, LAUNCH_OPTIONS))
for prob, draft, block_n, block_s in scan_specs:
    types = {"target_ptr": "*" + prob, "draft_ptr": "*" + prob, "ids_ptr": "*i32",
             "accepted_ptr": "*i32", "emitted_ptr": "*i64", "seed_ptr": "*i64",
             "offset_ptr": "*i64", "out_ptr": "*i32", "weight_ptr": "*fp64", "mass_ptr": "*fp64",
             "key_ptr": "*fp64", "token_ptr": "*i32"}
    constexprs = {"HAS_DRAFT": draft, "BLOCK_N": block_n, "BLOCK_S": block_s}
    out["scan"].append(compile_one(SCAN, types, constexprs, SCAN_LAUNCH_OPTIONS))
print(json.dumps(out))
'''


@pytest.fixture(scope="module")
def compiled():
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    env["PYTHONPATH"] = ROOT + os.pathsep + env.get("PYTHONPATH", "")
    args = [sys.executable, "-c", WORKER, json.dumps([ROW_SPECS, SCAN_SPECS])]
    proc = subprocess.run(args, capture_output=True, text=True, env=env, cwd=ROOT, timeout=900)
    assert proc.returncode == 0, proc.stderr[-4000:]
    out = json.loads(proc.stdout.strip().splitlines()[-1])
    if "skip" in out:
        pytest.skip(out["skip"])
    return out


def test_no_spills(compiled):
    for kind in ("row", "scan"):
        for spec, res in zip(ROW_SPECS if kind == "row" else SCAN_SPECS, compiled[kind]):
            assert not res["local_in_ptx"], (kind, spec)
            r = res["resources"]
            if r is not None:  # cuobjdump ships with triton's NVIDIA backend
                assert r.get("LOCAL", 0) == 0 and r.get("STACK", 0) == 0, (kind, spec, r)
                assert r["STL"] == 0 and r["LDL"] == 0 and r["REG"] <= 255, (kind, spec, r)


def test_row_pass_uses_16_byte_loads(compiled):
    for (prob, draft), res in zip(ROW_SPECS, compiled["row"]):
        # 1024 values over 128 threads: 8 per thread = 2 (fp32) or 1 (fp16/bf16) 16-byte loads per
        # row per chunk, in the prefetch prologue and in the loop; twice with the draft row.
        per_row = 2 if prob == "fp32" else 1
        assert len(res["v4_loads"]) == per_row * 2 * (2 if draft else 1), (prob, draft, res["v4_loads"])
