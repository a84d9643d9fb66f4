"""The package's layering, read from the imports in specops/ (docs/contributing.md, "Layout").

* specops/core/ is shared machinery: it imports no sampler package and not the demo;
* a sampler package (specops/chain/, specops/block/, ...) never imports the demo, nor another
  sampler, but for one import: the chain's public function runs block verification
  (``verification="block"``), so specops.chain.api imports specops.block.op;
* no two modules import each other, directly or through others.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parents[1] / "specops"


def module_name(path: Path) -> str:
    parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def imported_modules(path: Path) -> set[str]:
    """specops modules a file imports (a from-import names a module or a name inside one)."""
    name = module_name(path)
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    found = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:  # relative: resolve against this module's package
                anchor = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join(anchor + ([base] if base else []))
            found.add(base)
            found.update(f"{base}.{alias.name}" for alias in node.names)
    return {m for m in found if m == "specops" or m.startswith("specops.")}


MODULES = {module_name(p): p for p in sorted(PACKAGE.rglob("*.py"))}
IMPORTS = {name: {m for m in imported_modules(path) if m in MODULES} for name, path in MODULES.items()}
SAMPLERS = sorted({name.split(".")[1] for name, path in MODULES.items()
                   if path.parent != PACKAGE and name.split(".")[1] != "core"})


def test_imports_are_read():
    assert "chain" in SAMPLERS and "core" not in SAMPLERS
    assert "specops.core.race" in IMPORTS["specops.chain.reference"]
    assert "specops.chain.api" in IMPORTS["specops"]


@pytest.mark.parametrize("name", [n for n in MODULES if n.startswith("specops.core")])
def test_core_imports_no_sampler_and_not_the_demo(name):
    # The top-level package counts as a sampler import: its __init__ pulls every sampler in.
    forbidden = [f"specops.{s}" for s in SAMPLERS] + ["specops.demo"]
    bad = {m for m in IMPORTS[name]
           if m == "specops" or any(m == f or m.startswith(f + ".") for f in forbidden)}
    assert not bad, f"{name} imports {sorted(bad)}: core/ is shared and must not depend on a sampler"


@pytest.mark.parametrize("name", [n for n in MODULES if n.split(".")[1:2] and n.split(".")[1] in SAMPLERS])
def test_samplers_do_not_import_the_demo(name):
    assert "specops.demo" not in IMPORTS[name], f"{name} imports specops.demo"


# The one import across samplers (docs/contributing.md, "Layering").
CROSS_SAMPLER_IMPORTS = {("specops.chain.api", "specops.block"), ("specops.chain.api", "specops.block.op")}


@pytest.mark.parametrize("name", [n for n in MODULES if n.split(".")[1:2] and n.split(".")[1] in SAMPLERS])
def test_samplers_do_not_import_each_other(name):
    own = name.split(".")[1]
    others = {m for m in IMPORTS[name]
              if m.split(".")[1:2] and m.split(".")[1] in SAMPLERS and m.split(".")[1] != own}
    bad = others - {m for n, m in CROSS_SAMPLER_IMPORTS if n == name}
    assert not bad, f"{name} imports {sorted(bad)}: a sampler depends on core/ and itself only"


def test_no_import_cycles():
    graph = IMPORTS
    state: dict[str, int] = {}  # 1: on the current path, 2: done

    def visit(name: str, path: list[str]) -> None:
        state[name] = 1
        for dep in sorted(graph[name]):
            if state.get(dep) == 1:
                cycle = path[path.index(dep):] + [dep]
                pytest.fail("import cycle: " + " -> ".join(cycle))
            if dep not in state:
                visit(dep, path + [dep])
        state[name] = 2

    for name in sorted(graph):
        if name not in state:
            visit(name, [name])
