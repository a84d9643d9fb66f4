"""The package's layering, read from the imports in specops/ (docs/internals/contributing.md, "Layout").

* specops/core/ is shared machinery: it imports nothing of specops outside core/. Its folders:
  sampling/ (the sampling math, torch and Triton twins), logits/ (logits made into distributions),
  ops/ (registering and calling ops) and launch/ (launching Triton kernels);
* a sampler is a package with a plain reference (``reference.py``), a registered op (``op.py``),
  a kernel and its launcher; samplers that share rules live in a family package (specops/chain/:
  token/ and block/ verification), whose own modules import core/ only;
* a sampler imports core/, its family's shared modules and itself, never another sampler; a
  sampler of no family (specops/tree/) imports core/ and itself only;
* core/sampling/ (the math the rest builds on) imports only itself;
* a reference imports torch, the standard library and, directly or through others, only the
  sampling math in torch (core/sampling/, not its Triton twins), the plain rule of logits
  (core/logits/rule.py), its family's plain steps (chain/drafts.py, outputs.py, processed.py; tree/processed.py) and its own slots: no op, backend or
  launch code;
* the public layer (specops/__init__.py, api.py, warmup.py) imports the samplers; nothing in the
  package imports the demo, and no two modules import each other, directly or through others;
* specops/distributed/ (vocabulary-parallel verification) and specops/varlen/ (flattened batches)
  are public layers of their own above the samplers: each imports core/, chain/ (the references'
  steps, the ops), specops.api (its argument names) and itself, and nothing else in the package
  imports it.
"""

from __future__ import annotations

import ast
import sys
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
IMPORTS = {name: {m for m in imported_modules(path) if m in MODULES}
           for name, path in MODULES.items()}
# A sampler: a package with its own plain reference.
SAMPLERS = sorted(name.rpartition(".")[0] for name in MODULES if name.endswith(".reference"))
PUBLIC = {"specops", "specops.api", "specops.warmup"}
DEMO = "specops.demo"  # the demo and its tools: above the library, imported by nothing in it
DISTRIBUTED = "specops.distributed"
LAYERS = (DISTRIBUTED, "specops.varlen")  # public layers above the chain samplers


def sampler_of(module: str) -> str | None:
    return next((s for s in SAMPLERS if module == s or module.startswith(s + ".")), None)


def inside(module: str, package: str) -> bool:
    return module == package or module.startswith(package + ".")


@pytest.mark.parametrize("sampler", SAMPLERS)
def test_every_sampler_has_its_reference_op_kernel_and_launcher(sampler):
    missing = [f for f in ("reference", "op", "kernel", "launch", "slots")
               if f"{sampler}.{f}" not in MODULES]
    assert not missing, f"{sampler} lacks {missing} (docs/internals/contributing.md, 'Adding a sampler')"


@pytest.mark.parametrize("name", [n for n in MODULES if inside(n, "specops.core.sampling")])
def test_the_sampling_math_imports_only_itself(name):
    bad = {m for m in IMPORTS[name] if not inside(m, "specops.core.sampling")}
    assert not bad, f"{name} imports {sorted(bad)}: core/sampling/ is the math the rest builds on"


@pytest.mark.parametrize("name", [n for n in MODULES if inside(n, "specops.core")])
def test_core_imports_only_core(name):
    bad = {m for m in IMPORTS[name] if not inside(m, "specops.core")}
    assert not bad, f"{name} imports {sorted(bad)}: core/ is shared and depends on no sampler"


def allowed(importer: str, imported: str) -> bool:
    if inside(imported, "specops.core"):
        return True
    if imported in PUBLIC:
        return False
    own, target = sampler_of(importer), sampler_of(imported)
    if target is not None:
        return target == own
    # A shared module: of the importer's family (the package above its sampler, or its own). A
    # sampler directly under specops/ (tree/) has no family: core and itself only.
    family = (own or importer).rpartition(".")[0]
    if own is not None and family == "specops":
        return False
    return inside(imported, family)


@pytest.mark.parametrize("name", [n for n in MODULES if n not in PUBLIC and not inside(n, DEMO)
                                  and not inside(n, "specops.core")
                                  and not any(inside(n, layer) for layer in LAYERS)])
def test_samplers_import_core_their_family_and_themselves(name):
    bad = {m for m in IMPORTS[name] if not allowed(name, m)}
    assert not bad, (f"{name} imports {sorted(bad)}: a sampler depends on core/, its family's "
                     "shared modules and itself only")


# What a reference may lean on, directly or through what it imports: the sampling math, the plain
# rule of logits, its family's plain steps and its own slots; never registration, backend choice,
# launching, the rule's faster twins or its sampler's other implementations (the oracle must stay
# independent of them).
REFERENCE_MAY_IMPORT = ("specops.core.sampling.probs", "specops.core.sampling.race",
                        "specops.core.sampling.randomness", "specops.core.sampling.slots",
                        "specops.core.sampling.sums",
                        "specops.core.logits.rule", "specops.chain.drafts", "specops.chain.outputs",
                        "specops.chain.processed", "specops.tree.processed")


def imported_through(name: str) -> set[str]:
    """Every specops module ``name`` imports, directly or through others."""
    seen, todo = set(), [name]
    while todo:
        for m in IMPORTS[todo.pop()] - seen:
            seen.add(m)
            todo.append(m)
    return seen - {"specops", "specops.core", "specops.chain", "specops.core.logits"}


def third_party_imports(path: Path) -> set[str]:
    """Top-level names of the non-specops packages a file imports, outside the standard library."""
    found = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            found.update(alias.name.split(".")[0] for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and not node.level and node.module:
            found.add(node.module.split(".")[0])
    return found - set(sys.stdlib_module_names) - {"__future__", "specops"}


@pytest.mark.parametrize("sampler", SAMPLERS)
def test_references_import_no_op_backend_or_launch_code(sampler):
    name = f"{sampler}.reference"
    allowed = (*REFERENCE_MAY_IMPORT, f"{sampler}.slots")
    bad = {m for m in imported_through(name)
           if m != sampler and not any(inside(m, p) for p in allowed)}
    bad |= third_party_imports(MODULES[name]) - {"torch"}
    assert not bad, (f"{name} imports {sorted(bad)}: a reference is plain torch and the math it "
                     "specifies (core/sampling/, core/logits/rule.py)")


@pytest.mark.parametrize("layer, name", [(layer, n) for layer in LAYERS for n in MODULES
                                         if inside(n, layer)])
def test_layers_import_core_chain_the_api_and_themselves(layer, name):
    bad = {m for m in IMPORTS[name] if not (inside(m, "specops.core") or inside(m, "specops.chain")
                                            or inside(m, layer) or m in ("specops", "specops.api"))}
    assert not bad, f"{name} imports {sorted(bad)}: {layer} builds on core/, chain/ and the api"


@pytest.mark.parametrize("layer", LAYERS)
def test_nothing_else_imports_a_layer(layer):
    assert not [n for n in MODULES if not inside(n, layer)
                and any(inside(m, layer) for m in IMPORTS[n])]


def test_nothing_imports_the_demo():
    assert not [n for n in MODULES if not inside(n, DEMO)
                and any(inside(m, DEMO) for m in IMPORTS[n])]


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
