"""The README and docs run as written; the demo and the benchmark work end to end.

* the README's python blocks (the usage example) are executed;
* every python block in README.md and docs/**/*.md compiles; those preceded by a
  ``<!-- runnable -->`` line are executed, and those preceded by ``<!-- runnable-gpu -->`` are
  executed where CUDA is available (benchmarks/gpu_check.py runs this file on the GPU machine);
* relative links in the docs point at files that exist;
* the documented shell commands name files and demo flags that exist; the README's test command is
  the one CI runs;
* ``python -m specops.demo`` at small sizes (contributing.md's interpreter command too) prints its
  report and passes its lossless check, fails it when the op is biased on purpose, and answers bad
  flags with one line each;
* ``benchmarks/benchmark.py --quick`` writes its CSV.
"""

from __future__ import annotations

import csv
import itertools
import os
import re
import subprocess
import sys
import types
from pathlib import Path

import pytest
import torch

ROOT = Path(__file__).resolve().parents[1]
DOCS = sorted((ROOT / "docs").rglob("*.md"))
BLOCKS_RUN = itertools.count()
BLOCK = re.compile(r"(?:<!-- (runnable|runnable-gpu) -->[ \t]*\n)?```python\n(.*?)```", re.S)


def python_blocks(path: Path) -> list[tuple[str, bool, int]]:
    """(code, runs here, line number) of every python block of a markdown file."""
    text = path.read_text()
    runs = {"runnable": True, "runnable-gpu": torch.cuda.is_available(), None: False}
    return [(m.group(2), runs[m.group(1)], text.count("\n", 0, m.start(2)) + 1)
            for m in BLOCK.finditer(text)]


def run_block(code: str, name: str) -> None:
    """Run a doc block as a module of its own (torch.compile looks its globals' module up; torch
    2.6's Dynamo refuses a second module object under a name it has seen)."""
    module = types.ModuleType(f"__doc_block_{next(BLOCKS_RUN)}__")
    sys.modules[module.__name__] = module
    try:
        exec(compile(code, name, "exec"), module.__dict__)
    finally:
        del sys.modules[module.__name__]


def all_blocks():
    for path in [ROOT / "README.md", *DOCS]:
        for code, runnable, line in python_blocks(path):
            yield pytest.param(code, runnable, id=f"{path.relative_to(ROOT)}:{line}")


def test_readme_commands_are_the_ones_ci_runs():
    # The README's first block is what a newcomer types; CI must run its test command as written.
    text = (ROOT / "README.md").read_text()
    commands = [line.split("#")[0].strip()
                for line in re.search(r"```bash\n(.*?)```", text, re.S).group(1).splitlines()]
    assert "python -m specops.demo" in commands and "python -m pytest -q" in commands
    ci_commands = [line.strip() for line in (ROOT / ".ci" / "run").read_text().splitlines()]
    assert "python -m pytest -q" in ci_commands


def test_readme_usage_example_runs(capsys):
    blocks = python_blocks(ROOT / "README.md")
    assert blocks, "README.md has no python usage example"
    for code, _, line in blocks:
        run_block(code, f"README.md:{line}")
    assert "tensor(" in capsys.readouterr().out


@pytest.mark.parametrize("code,runnable", list(all_blocks()))
def test_doc_python_block(code, runnable):
    compile(code, "<doc block>", "exec")
    if runnable:
        run_block(code, "<doc block>")


@pytest.mark.parametrize("path", [ROOT / "README.md", *DOCS], ids=lambda p: p.name)
def test_relative_links_exist(path):
    for target in re.findall(r"\]\(([^)#\s]+)(?:#[^)]*)?\)", path.read_text()):
        if "://" in target:
            continue
        assert (path.parent / target).exists(), f"{path.name} links to missing {target}"


def run(args: list[str], timeout: int) -> str:
    # The checkout on PYTHONPATH: a script's own folder, not the checkout, heads its sys.path.
    path = os.pathsep.join(p for p in (str(ROOT), os.environ.get("PYTHONPATH")) if p)
    env = dict(os.environ, PYTHONUNBUFFERED="1", PYTHONPATH=path)
    result = subprocess.run([sys.executable, *args], cwd=ROOT, env=env, capture_output=True,
                            text=True, timeout=timeout)
    assert result.returncode == 0, result.stdout + result.stderr
    return result.stdout


def test_demo_small_run_reports_and_is_lossless():
    out = run(["-m", "specops.demo", "--batch-size", "64", "--length", "160", "--seed", "1"], 120)
    for line in ("characters per target call", "drafts kept per step", "drafts accepted by own coin",
                 "draft-only (control)", "target-only", "throughput"):
        assert line in out, out
    assert "lossless check               PASS" in out, out
    if not torch.cuda.is_available():  # eager by default on a CPU, where compiling is slower
        assert "compile: off" in out and "compile and warm-up" not in out, out


def test_demo_eager_options():
    out = run(["-m", "specops.demo", "--no-compile", "--batch-size", "1", "--length", "12",
               "--draft-len", "2", "--draft-order", "2", "--device", "cpu"], 120)
    assert "compile: off" in out and "1 sequence x 12 characters" in out, out
    assert "TOO FEW CHARACTERS" in out, out  # 12 characters cannot reject the control


@pytest.mark.parametrize("flags", [
    ["--temperature", "0.7", "--top-k", "20", "--top-p", "0.9", "--min-p", "0.01"],
    ["--temperature", "1.5", "--top-p", "0.8", "--verification", "block"],
    ["--temperature", "0"],
], ids=["token-all-parameters", "block-top-p", "greedy"])
def test_demo_with_sampling_parameters_is_lossless(flags):
    """The demo verifies from logits with the parameters given; its check compares the output
    with the processed target rows, so a path that ignored a parameter would fail it."""
    out = run(["-m", "specops.demo", "--batch-size", "64", "--length", "160", "--seed", "1",
               *flags], 120)
    assert f"temperature {flags[1]}" in out, out
    assert "lossless check               PASS" in out, out
    # Greedy decoding draws no coins: the demo reports drafts equal to the target's choice.
    greedy = flags[1] == "0"
    assert ("accepted by own coin" in out) != greedy and ("equal to the target's" in out) == greedy


def test_demo_runs_beside_a_clone_named_specops(tmp_path):
    """From the folder that holds a clone named specops/ (no __init__.py at its root), the
    installed package, not that folder, is what ``specops`` imports (pyproject.toml's
    package-dir: the editable install puts the checkout on sys.path)."""
    (tmp_path / "specops").mkdir()
    (tmp_path / "specops" / "README.md").write_text("a clone's root\n")
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    result = subprocess.run([sys.executable, "-m", "specops.demo", "--no-compile", "--batch-size",
                             "1", "--length", "12", "--device", "cpu"], cwd=tmp_path, env=env,
                            capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "characters per target call" in result.stdout, result.stdout


@pytest.mark.interpreter
def test_contributing_interpreter_demo_command_passes():
    """contributing.md's command: the demo through the Triton kernel under the interpreter."""
    command = "TRITON_INTERPRET=1 SPECOPS_BACKEND=triton python -m specops.demo --batch-size 8 --length 8"
    assert command in (ROOT / "docs" / "internals" / "contributing.md").read_text()
    env = dict(os.environ, TRITON_INTERPRET="1", SPECOPS_BACKEND="triton", CUDA_VISIBLE_DEVICES="")
    result = subprocess.run([sys.executable, *command.split()[3:]], cwd=ROOT, env=env,
                            capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "lossless check               PASS" in result.stdout, result.stdout


def demo_error(*args: str) -> str:
    result = subprocess.run([sys.executable, "-m", "specops.demo", *args], cwd=ROOT,
                            capture_output=True, text=True, timeout=60)
    assert result.returncode == 2 and "Traceback" not in result.stderr, result.stderr
    return result.stderr.strip().splitlines()[-1]


def test_demo_bad_flags_get_their_own_one_line_message(capsys):
    # One through `python -m specops.demo` itself, the rest through its parser in this process.
    assert "--draft-len: expected a whole number >= 1, got '0'" in demo_error("--draft-len", "0")

    def parser_error(*args: str) -> str:
        import specops.demo

        with pytest.raises(SystemExit) as info:
            specops.demo.parse_args(list(args))
        assert info.value.code == 2
        return capsys.readouterr().err.strip().splitlines()[-1]

    assert "--batch-size: expected a whole number >= 1, got 'x'" in parser_error("--batch-size", "x")
    assert "--length: expected a whole number >= 1, got '-3'" in parser_error("--length", "-3")
    assert "--device: expected cpu or cuda, got 'tpu'" in parser_error("--device", "tpu")
    assert "--temperature: expected a number in [0, inf], got '-1'" in parser_error(
        "--temperature", "-1")
    assert "--top-k: expected a whole number in [0, inf], got '2.5'" in parser_error("--top-k", "2.5")
    assert "--top-p: expected a number in (0, 1], got '0'" in parser_error("--top-p", "0")
    assert "--min-p: expected a number in [0, 1], got 'x'" in parser_error("--min-p", "x")
    if not torch.cuda.is_available():
        assert "--device: CUDA is not available" in parser_error("--device", "cuda")


@pytest.mark.parametrize("children", ["sampled", "top-k"])
def test_demo_tree_reports_against_the_chain_and_is_lossless(children):
    out = run(["-m", "specops.demo", "--tree", "2x3", "--tree-children", children,
               "--batch-size", "64", "--length", "160", "--seed", "1"], 120)
    tree = float(re.search(r"characters per target call +([0-9.]+)", out).group(1))
    traversal = float(re.search(r"with traversal verification +([0-9.]+)", out).group(1))
    chain = float(re.search(r"the chain of the same depth +([0-9.]+)", out).group(1))
    assert "a full tree of 2x3 (14 draft characters" in out and "N = 3" in out, out
    assert tree > chain and traversal > chain, out
    if children == "top-k":  # target-only, from the same random state: the rules are one
        assert traversal == tree, out
    assert "lossless check               PASS" in out and "traversal (specops)" in out, out


@pytest.mark.parametrize("args,message", [
    (["--tree", "3"], "--tree: expected WIDTHxDEPTH, such as 2x4; got '3'"),
    (["--tree", "0x2"], "--tree: expected WIDTHxDEPTH, such as 2x4; got '0x2'"),
    (["--tree", "4x8"], "--tree: 4x8 makes a tree of 87380 nodes; at most 1023"),
    (["--tree-children", "all"], "--tree-children: invalid choice: 'all'"),
    (["--tree", "2x2", "--top-k", "3", "--min-p", "0.1"],
     "--tree verifies the models' probabilities as they are; sampling parameters (--top-k, "
     "--min-p) are for chains only"),
])
def test_demo_tree_flags_get_one_line_messages(args, message, capsys):
    import specops.demo

    with pytest.raises(SystemExit) as info:  # argparse's own exit: a usage line and the message
        specops.demo.parse_args(args)
    assert info.value.code == 2
    assert message in capsys.readouterr().err.strip().splitlines()[-1]


def test_demo_tree_check_catches_a_biased_sampler(monkeypatch, capsys):
    import specops.demo

    honest = specops.tree_speculative_sampling

    def biased(draft_probs, draft_token_ids, parents, target_probs, **kwargs):
        # Target rows scaled by 3: children are accepted far too often.
        return honest(draft_probs, draft_token_ids, parents, target_probs * 3, **kwargs)

    monkeypatch.setattr(specops, "tree_speculative_sampling", biased)
    threads = torch.get_num_threads()
    try:
        result = specops.demo.main(["--tree", "2x3", "--batch-size", "64", "--length", "160",
                                    "--device", "cpu"])
    finally:
        torch.set_num_threads(threads)
    assert not result["lossless"]
    assert "lossless check               FAIL" in capsys.readouterr().out


def test_demo_help_is_plain_and_shows_defaults():
    out = run(["-m", "specops.demo", "--help"], 60)
    assert "(default: 128)" in out and "(default: auto)" in out, out
    assert "``" not in out, out


def test_benchmark_quick(tmp_path):
    out = run([str(ROOT / "benchmarks" / "benchmark.py"), "--quick", "--out", str(tmp_path)], 120)
    assert "copy bandwidth" in out
    with (tmp_path / "benchmark.csv").open() as f:
        rows = list(csv.DictReader(f))
    assert {"specops", "loop", "eager", "floor"} <= {r["impl"] for r in rows}
    assert all(float(r["latency_us"]) > 0 and int(r["needed_bytes"]) > 0 for r in rows)


def test_demo_check_catches_a_biased_sampler(monkeypatch, capsys):
    import specops.demo

    honest = specops.chain_speculative_sampling_from_logits

    def biased(draft_probs, draft_token_ids, target_logits, *args, draft_logits, **kwargs):
        # Target logits pulled half-way to the draft's: the output leans to the draft.
        target_logits = (target_logits + torch.nn.functional.pad(draft_logits, (0, 0, 0, 1))) / 2
        return honest(draft_probs, draft_token_ids, target_logits, *args,
                      draft_logits=draft_logits, **kwargs)

    monkeypatch.setattr(specops, "chain_speculative_sampling_from_logits", biased)
    threads = torch.get_num_threads()
    try:
        result = specops.demo.main(["--batch-size", "64", "--length", "160", "--device", "cpu"])
    finally:
        torch.set_num_threads(threads)
    assert not result["lossless"]
    assert "lossless check               FAIL" in capsys.readouterr().out


def shell_commands():
    """Every command line of the bash blocks of README.md and docs/**/*.md (comments stripped)."""
    for path in [ROOT / "README.md", *DOCS]:
        for block in re.findall(r"```bash\n(.*?)```", path.read_text(), re.S):
            for line in block.splitlines():
                command = line.split("  #")[0].strip()
                if command:
                    yield pytest.param(command, id=f"{path.name}: {command}")


@pytest.mark.parametrize("command", list(shell_commands()))
def test_doc_commands_name_what_exists(command):
    """The files, tests and demo flags a documented command names exist (the commands that are
    cheap enough run elsewhere in this file: the demo, the benchmark's --quick, the README's)."""
    words = [w for w in command.split() if "=" not in w or w.startswith("-")]
    if words[:3] == ["python", "-m", "specops.demo"]:
        import specops.demo

        specops.demo.parse_args(words[3:])  # exits (SystemExit) on a flag it does not know
    for word in words:
        if word.startswith(("tests/", "benchmarks/")):
            assert (ROOT / word).exists(), f"{command!r} names missing {word}"
