"""The benchmark scripts: the byte model, the eager baseline, honest plots, a rehearsal of the GPU
check on CPU (benchmarks/gpu_check.py --rehearse: its kernels against the reference, under the
interpreter), and the quick runs of the from-logits, vocab-parallel and tree benchmarks, each of
which checks what it measures."""

from __future__ import annotations

import csv
import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
import torch

ROOT = Path(__file__).resolve().parents[1]
BENCH = ROOT / "benchmarks"


@pytest.fixture
def bench(monkeypatch):
    """The benchmarks folder importable, as it is for its own scripts."""
    monkeypatch.syspath_prepend(str(BENCH))
    import benchmark
    import common

    return common, benchmark


def run_script(args: list[str], timeout: float, env: dict | None = None) -> subprocess.CompletedProcess:
    # A script's own folder, not the checkout, heads its sys.path: the checkout goes on
    # PYTHONPATH, so that the scripts run this checkout's specops, installed or not.
    path = os.pathsep.join(p for p in (str(ROOT), os.environ.get("PYTHONPATH")) if p)
    return subprocess.run([sys.executable, *args], capture_output=True, text=True, timeout=timeout,
                          cwd=ROOT, env={**os.environ, "PYTHONPATH": path, **(env or {})})


def test_needed_bytes_worst_case_and_from_the_output(bench):
    common, _ = bench
    b, n, v, s = 3, 2, 100, 4
    fixed = b * (2 * n * s + 8 * n + 4 * (n + 1))
    assert common.needed_bytes(b, n, v, torch.float32) == fixed + 2 * b * v * s
    # Request 0 rejects at position 0, request 1 at position 1, request 2 accepts both (bonus row only).
    output = torch.tensor([[5, -1, -1], [5, 6, -1], [5, 6, 7]], dtype=torch.int32)
    assert common.needed_bytes(b, n, v, torch.float32, output=output) == fixed + (b + 2) * v * s
    assert common.needed_bytes(b, n, v, torch.bfloat16) == b * (4 * n + 8 * n + 4 * (n + 1)) + 2 * b * v * 2
    with pytest.raises(ValueError, match="output has shape"):
        common.needed_bytes(b, n + 1, v, torch.float32, output=output)


def test_eager_baseline_emits_a_valid_chain(bench):
    common, _ = bench
    gen = torch.Generator().manual_seed(0)
    draft, ids, target = common.make_inputs(16, 3, 50, torch.float32, "cpu", gen)
    out = common.eager_chain_sampling(draft, ids, target)
    emitted = (out >= 0).sum(1)
    assert out.shape == (16, 4) and bool((emitted >= 1).all())
    for b in range(16):
        e = int(emitted[b]) - 1  # drafts accepted before the last token
        assert torch.equal(out[b, :e], ids[b, :e].int()) and bool((out[b, e + 1:] == -1).all())
        assert 0 <= int(out[b, e]) < 50


def rows_for(points, impls=("specops", "floor")):
    return [{"device": "cpu", "dtype": "float32", "batch": b, "num_draft": n, "vocab": v, "impl": impl,
             "latency_us": 10.0 * b, "needed_bytes": 1000 * b, "needed_GBps": 1.0, "fraction_of_copy_bw": 0.1}
            for b, n, v in points for impl in impls]


def test_plot_draws_only_measured_sweeps(bench, tmp_path):
    _, benchmark = bench
    single = benchmark.plot(rows_for([(64, 4, 32000)]), tmp_path / "one.png", 1e10)
    assert single.startswith("no plot") and not (tmp_path / "one.png").exists()
    message = benchmark.plot(rows_for([(1, 4, 4096), (8, 4, 4096)]), tmp_path / "b.png", 1e10)
    assert message.startswith("wrote") and "batch size B at vocab = 4096" in message
    assert "vocabulary" not in message  # one batch size per vocabulary: no V sweep to draw
    assert (tmp_path / "b.png").stat().st_size > 0


@pytest.mark.interpreter
def test_gpu_check_rehearsal(tmp_path):
    """The grid, the agreement count and the optional host step, rehearsed on CPU (~10 s)."""
    proc = run_script([str(BENCH / "gpu_check.py"), "--rehearse", "--step", "grid-float32",
                       "--step", "agreement", "--step", "host"], 240, env={"OUT": str(tmp_path)})
    assert proc.returncode == 0, proc.stdout + proc.stderr
    steps = [json.loads(line) for line in (tmp_path / "steps.jsonl").read_text().splitlines()]
    assert [s["step"] for s in steps] == ["grid-float32", "agreement", "host"]
    assert steps[0]["status"] == steps[1]["status"] == "passed"
    with (tmp_path / "grid.csv").open() as f:
        rows = list(csv.DictReader(f))
    assert len(rows) == 2 and all(float(r["ours_eager_us"]) > 0 and float(r["base_eager_us"]) > 0 for r in rows)
    assert all(r["ours_graph_us"] == "" for r in rows)  # no CUDA graphs on CPU
    assert "CUDA-graph timings skipped" in (tmp_path / "grid-float32.log").read_text()
    agreement = (tmp_path / "agreement.log").read_text()
    assert '"mismatched": 0' in agreement and '"verification": "tree"' in agreement
    assert "| grid-float32 | passed |" in (tmp_path / "summary.md").read_text()


def test_from_logits_benchmark_quick():
    """benchmarks/from_logits.py on its smoke-test shape: its user-written rows pass its own check
    against the rule (else it exits), and every mix gets a positive time on both sides."""
    proc = run_script([str(BENCH / "from_logits.py"), "--quick"], 300)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    rows = [line.split() for line in proc.stdout.splitlines() if line.strip().startswith("2 ")]
    assert len(rows) == 10 and all(float(row[-5]) > 0 and float(row[-4]) > 0 for row in rows), proc.stdout


def test_vocab_parallel_quick():
    """benchmarks/vocab_parallel.py --quick: 2 gloo ranks, both methods, the bytes each sends."""
    proc = run_script([str(BENCH / "vocab_parallel.py"), "--quick"], 120)
    assert proc.returncode == 0, proc.stderr
    lines = [line for line in proc.stdout.splitlines() if line.startswith("| 4 |")]
    methods = [line.split("|")[4].strip() for line in lines]
    assert methods == ["all-gather + single device", "vocab-parallel"]
    gather, parallel = (int(line.split("|")[6].strip().replace(",", "")) for line in lines)
    assert parallel * 100 < gather  # O(B (N + 1)) against O(B (N + 1) V)


def test_tree_verification_benchmark_quick():
    """benchmarks/tree_verification.py on its smoke-test grid: every column filled, the tree
    keeps more characters per call than its chain with either rule, and the traversal section
    reports both rules' tokens per call and the traversal op's time."""
    proc = run_script([str(BENCH / "tree_verification.py"), "--quick"], 300)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    row = next(line.split() for line in proc.stdout.splitlines() if line.strip().startswith("2 "))
    assert len(row) == 11 and all(float(x) > 0 for x in row[5:]), proc.stdout
    gains = [line for line in proc.stdout.splitlines() if "(lossless" in line]
    assert gains, proc.stdout
    for line in gains:
        tree, chain = (float(x) for x in re.findall(r"(?:tree|chain) ([0-9.]+)", line))
        assert tree > chain and "lossless PASS" in line, line
        assert float(re.search(r"traversal ([0-9.]+)", line).group(1)) > chain, line
    # Traversal against token verification: both rules' tokens per call on the same trees.
    worlds = [line.split() for line in proc.stdout.splitlines() if line.startswith("  full 2x2")]
    assert len(worlds) == 2, proc.stdout
    assert all(float(w[4]) >= 1 and float(w[5]) >= 1 for w in worlds), proc.stdout
    assert "traversal/floor" in proc.stdout, proc.stdout


def test_varlen_benchmark_runs():
    """benchmarks/varlen.py at a small size: both length mixes, both verifications, every column
    a positive time."""
    proc = run_script([str(BENCH / "varlen.py"), "--batch", "4", "--vocab", "2000"], 300)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    rows = [line.split() for line in proc.stdout.splitlines()
            if line.startswith(("mixed", "uniform"))]
    assert [row[:2] for row in rows] == [["mixed", "token"], ["mixed", "block"],
                                         ["uniform", "token"], ["uniform", "block"]], proc.stdout
    assert all(float(x) > 0 for row in rows for x in row[2:]), proc.stdout


def test_sampling_step_benchmark_runs():
    """benchmarks/sampling_step.py at a small size: every variant for both verifications, each a
    positive time, the plain call's ratio 1."""
    proc = run_script([str(BENCH / "sampling_step.py"), "--batch", "2", "--vocab", "500"], 300)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    rows = [line.split() for line in proc.stdout.splitlines()
            if line.startswith(("token", "block"))]
    assert len(rows) == 23 and [row[1] for row in rows[:6:5]] == ["plain", "all"], proc.stdout
    assert all(float(row[-2]) > 0 for row in rows) and rows[0][-1] == "1.00", proc.stdout
