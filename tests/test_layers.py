"""The layering holds by imports: loaders/ knows formats only, workers/ execution only."""
from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
FORBIDDEN = {"loaders": {"ingest", "workers"}, "workers": {"ingest", "loaders"}}


def absolute_imports(path: Path) -> set[str]:
    """Top-level names of every absolute import in a module, at any depth (inside functions too)."""
    names: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            names.update(alias.name.split(".")[0] for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            names.add(node.module.split(".")[0])
    return names


@pytest.mark.parametrize("layer", sorted(FORBIDDEN))
def test_layer_imports_only_itself(layer: str) -> None:
    bad = {str(p.relative_to(ROOT)): sorted(absolute_imports(p) & FORBIDDEN[layer])
           for p in (ROOT / layer).rglob("*.py")}
    assert not {k: v for k, v in bad.items() if v}


def test_no_module_over_400_lines() -> None:
    long = {str(p.relative_to(ROOT)): n for layer in ("ingest", "loaders", "workers")
            for p in (ROOT / layer).rglob("*.py") if (n := len(p.read_text(encoding="utf-8").splitlines())) > 400}
    assert not long


def test_api_and_encode_pool_import_without_torch() -> None:
    code = "import sys, ingest.api, ingest.workers.encode; assert 'torch' not in sys.modules, 'torch imported'"
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr


def ingest_imports(path: Path) -> set[str]:
    """Every `ingest.X[.Y]` module a module imports absolutely (from-imports by their module)."""
    names: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            names.update(a.name for a in node.names if a.name.startswith("ingest."))
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and (node.module or "").startswith("ingest."):
            names.add(node.module)
    return names


STEPS = ("ingest.scan", "ingest.sniff", "ingest.load", "ingest.chunk", "ingest.ocr", "ingest.encode", "ingest.write")
FACES = ("ingest.api", "ingest.cli", "ingest.engines")


def within(module: str, names: tuple[str, ...]) -> bool:
    return any(module == n or module.startswith(n + ".") for n in names)


def test_the_store_family_imports_no_step_and_the_steps_no_face() -> None:
    """The store knows Milvus and the manifest, not the steps that feed it; the steps do not import the
    public API, the CLI or an engine (the engines import the steps)."""
    bad = {}
    for p in (ROOT / "ingest" / "store").glob("*.py"):
        bad[p.name] = sorted(m for m in ingest_imports(p) if within(m, STEPS + FACES))
    for step in STEPS:
        p = ROOT / (step.replace(".", "/") + ".py")
        bad[p.name] = sorted(m for m in ingest_imports(p) if within(m, FACES))
    assert not {k: v for k, v in bad.items() if v}


PIPELINE = STEPS + ("ingest.files", "ingest.sections", "ingest.reuse", "ingest.vector_cache", "ingest.encode_pool")


def runtime_imports(path: Path, skip_functions: tuple[str, ...] = ()) -> set[str]:
    """The `ingest.*` modules a module imports when it runs (at any depth), leaving out `if TYPE_CHECKING:` blocks
    (type names only) and the bodies of the functions named in `skip_functions`; `from a.b import c` counts as
    a.b and, when it is a module, a.b.c."""
    tree = ast.parse(path.read_text(encoding="utf-8"))
    skipped: set[int] = set()
    for node in ast.walk(tree):
        typing_only = isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test)
        if typing_only or isinstance(node, ast.FunctionDef) and node.name in skip_functions:
            skipped.update(id(n) for n in ast.walk(node) if n is not node or typing_only)
    names: set[str] = set()
    for node in ast.walk(tree):
        if id(node) in skipped:
            continue
        if isinstance(node, ast.Import):
            names.update(a.name for a in node.names if a.name.startswith("ingest."))
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and (node.module or "").startswith("ingest."):
            names.add(node.module)
            names.update(f"{node.module}.{a.name}" for a in node.names
                         if (ROOT / (node.module.replace(".", "/") + f"/{a.name}.py")).exists())
    return names


def test_the_store_imports_no_pipeline_module_and_no_store_module_imports_itself_back() -> None:
    """Issue 39, item 5: no module of ingest/store/ imports a step of the pipeline (nor the modules of the values
    the steps pass), and none imports, through any chain, a module that imports it back. `uri.store_class` is the
    registry, which imports each store when asked for it, so its imports are not edges (every store may parse
    URIs with `uri`)."""
    store = ROOT / "ingest" / "store"
    graph = {f"ingest.store.{p.stem}": runtime_imports(p, ("store_class",) if p.stem == "uri" else ())
             for p in store.glob("*.py") if p.stem != "__init__"}
    bad = {m: sorted(i for i in deps if within(i, PIPELINE + FACES)) for m, deps in graph.items()}
    assert not {m: v for m, v in bad.items() if v}
    cycles = []
    for start in graph:
        stack = [(start, (start,))]
        while stack:
            node, path = stack.pop()
            for dep in graph.get(node, ()):
                if dep == start:
                    cycles.append(" -> ".join(path + (start,)))
                elif dep in graph and dep not in path:
                    stack.append((dep, path + (dep,)))
    assert not cycles, cycles[:5]
