"""matplotlib and tqdm are the ``bench`` extra's (plots and progress bars), not in the service
image: no module of libs/, services/ or radixmesh/ may import them when it is imported, only
inside the functions that draw or count (``radixmesh up`` imports the bench CLI too)."""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = ("libs", "services", "radixmesh")
BENCH_ONLY = ("matplotlib", "tqdm")


def module_level_imports(tree: ast.AST) -> list[tuple[str, int]]:
    """(top-level package, line) of every import that runs when the module is imported:
    function bodies are skipped, class bodies and ``if`` / ``try`` blocks are not."""
    found: list[tuple[str, int]] = []
    todo = list(ast.iter_child_nodes(tree))
    while todo:
        node = todo.pop()
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda)):
            continue
        if isinstance(node, ast.Import):
            found += [(a.name.split(".")[0], node.lineno) for a in node.names]
        elif isinstance(node, ast.ImportFrom) and not node.level and node.module:
            found.append((node.module.split(".")[0], node.lineno))
        todo.extend(ast.iter_child_nodes(node))
    return found


def test_the_scan_sees_module_level_imports_only():
    tree = ast.parse("import tqdm.auto\nif x:\n    from matplotlib import pyplot\n"
                     "class A:\n    import numpy\ndef f():\n    import torch\n")
    assert sorted(module_level_imports(tree)) == [("matplotlib", 3), ("numpy", 5), ("tqdm", 1)]


def test_no_module_imports_bench_packages_at_import_time():
    offenders = []
    for pkg in PACKAGES:
        for path in sorted((ROOT / pkg).rglob("*.py")):
            for name, line in module_level_imports(ast.parse(path.read_text(), str(path))):
                if name in BENCH_ONLY:
                    offenders.append(f"{path.relative_to(ROOT)}:{line} imports {name}")
    assert not offenders, offenders


def test_services_and_the_cli_import_without_matplotlib():
    """The real imports, with matplotlib unavailable (tqdm cannot be hidden the same way:
    transformers' hub client needs it, so the scan above covers it)."""
    mods = [f"services.{s}.__main__" for s in
            ("cache_index", "tokenizer", "scheduler", "gpu_worker", "gateway")] + ["radixmesh.cli"]
    code = ("import importlib, sys; sys.modules['matplotlib'] = None; "
            f"[importlib.import_module(m) for m in {mods!r}]")
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True,
                         timeout=120)
    assert out.returncode == 0, out.stderr[-3000:]
