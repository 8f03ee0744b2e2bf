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


STEPS = ("ingest.scan", "ingest.sniff", "ingest.load", "ingest.chunk", "ingest.ocr", "ingest.encode", "ingest.write",
         "ingest.ledger")
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


def store_graph(skip: dict[str, tuple[str, ...]] | None = None) -> dict[str, set[str]]:
    """The store family's import graph: each module of ingest/store/ (but `__init__`) to the `ingest.*` modules it
    imports when it runs (runtime_imports), functions in `skip` ({module stem: function names}) left out."""
    return {f"ingest.store.{p.stem}": runtime_imports(p, (skip or {}).get(p.stem, ()))
            for p in (ROOT / "ingest" / "store").glob("*.py") if p.stem != "__init__"}


def cycles(graph: dict[str, set[str]]) -> list[str]:
    """Every chain of imports in `graph` that comes back to where it started."""
    found = []
    for start in graph:
        stack = [(start, (start,))]
        while stack:
            node, path = stack.pop()
            for dep in graph.get(node, ()):
                if dep == start:
                    found.append(" -> ".join(path + (start,)))
                elif dep in graph and dep not in path:
                    stack.append((dep, path + (dep,)))
    return found


def test_the_store_imports_no_pipeline_module_and_no_store_module_imports_itself_back() -> None:
    """Issue 39, item 5: no module of ingest/store/ imports a step of the pipeline (nor the modules of the values
    the steps pass), and none imports, through any chain, a module that imports it back."""
    graph = store_graph()
    bad = {m: sorted(i for i in deps if within(i, PIPELINE + FACES)) for m, deps in graph.items()}
    assert not {m: v for m, v in bad.items() if v}
    assert not cycles(graph), cycles(graph)[:5]


def test_the_store_family_has_no_cycle_counting_lazy_imports() -> None:
    """Issue 40, item 3: the imports inside functions count too (a lazy import is still an edge of the drawing).
    The helpers every store parses URIs with (`local_path`, `kind`: ingest/store/uri.py) import no store; only
    the factory (ingest/store/factory.py: `open_store`, `store_at`) imports the stores, and no store imports
    the factory, so the family is a tree of imports, not a circle."""
    graph = store_graph()
    found = cycles(graph)
    assert not found, f"{len(found)} import cycles in ingest/store/, e.g. {found[:3]}"
    stores = {m for m in graph if m.rsplit(".", 1)[1] in ("milvus", "postgres", "qdrant", "lancedb", "null")}
    assert stores <= graph["ingest.store.factory"] and not graph["ingest.store.uri"] & stores
    users = {m for m, deps in graph.items() if "ingest.store.factory" in deps}
    assert users <= {"ingest.store.collection", "ingest.store.writers"}, users    # the family's own steps
