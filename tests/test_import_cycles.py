"""No import cycles in the project: every import counts, also those under ``if TYPE_CHECKING:``
and inside functions (a cycle hidden that way is still one class split across two modules).
And libs/ stays below the services: no library imports from services/ or radixmesh/.

The graph is read from the source with ``ast`` (nothing is imported): one node per module under
libs/, services/ and radixmesh/, one edge per import of another project module. ``from pkg import
name`` is an edge to ``pkg.name`` when that is a module, else to ``pkg``; importing ``a.b`` does
not count as importing ``a`` (a package's ``__init__`` re-exporting its own modules is no cycle).
"""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = ("libs", "services", "radixmesh")

def module_name(path: Path, root: Path) -> str:
    parts = list(path.relative_to(root).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def import_graph(root: Path, packages=PACKAGES) -> dict[str, dict[str, int]]:
    """module -> {imported project module: line of the first such import}."""
    files = {module_name(p, root): p for pkg in packages for p in sorted((root / pkg).rglob("*.py"))}
    graph: dict[str, dict[str, int]] = {}
    for mod, path in files.items():
        is_pkg = path.name == "__init__.py"
        edges = graph.setdefault(mod, {})
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            for target in _targets(node, mod, is_pkg, files):
                if target != mod:
                    edges.setdefault(target, node.lineno)
    return graph


def _targets(node: ast.AST, mod: str, is_pkg: bool, files) -> list[str]:
    if isinstance(node, ast.Import):
        return [m for m in (_known(a.name, files) for a in node.names) if m]
    if not isinstance(node, ast.ImportFrom):
        return []
    base = node.module or ""
    if node.level:
        package = mod.split(".") if is_pkg else mod.split(".")[:-1]
        package = package[: len(package) - node.level + 1]
        base = ".".join(package + ([base] if base else []))
    out = []
    for alias in node.names:
        sub = f"{base}.{alias.name}"
        target = sub if sub in files else _known(base, files)
        if target:
            out.append(target)
    return out


def _known(name: str, files) -> str | None:
    """``name`` or its longest prefix that is a project module (``import a.b.c`` of a package)."""
    parts = name.split(".")
    for n in range(len(parts), 0, -1):
        if ".".join(parts[:n]) in files:
            return ".".join(parts[:n])
    return None


def cycles(graph: dict[str, dict[str, int]]) -> list[list[str]]:
    """One cycle (a path that returns to its start) per strongly connected component > 1."""
    adj = {m: sorted(t for t in ts if t in graph) for m, ts in graph.items()}
    return [_cycle_in(scc, adj) for scc in _sccs(adj) if len(scc) > 1]


def _sccs(adj: dict[str, list[str]]) -> list[set[str]]:
    """Tarjan's algorithm, iterative (deep import chains must not hit the recursion limit)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    out: list[set[str]] = []
    for start in sorted(adj):
        if start in index:
            continue
        work = [(start, iter(adj[start]))]
        index[start] = low[start] = len(index)
        stack.append(start)
        on_stack.add(start)
        while work:
            node, it = work[-1]
            nxt = next(it, None)
            if nxt is None:
                work.pop()
                if work:
                    low[work[-1][0]] = min(low[work[-1][0]], low[node])
                if low[node] == index[node]:
                    scc = set()
                    while True:
                        m = stack.pop()
                        on_stack.discard(m)
                        scc.add(m)
                        if m == node:
                            break
                    out.append(scc)
            elif nxt not in index:
                index[nxt] = low[nxt] = len(index)
                stack.append(nxt)
                on_stack.add(nxt)
                work.append((nxt, iter(adj[nxt])))
            elif nxt in on_stack:
                low[node] = min(low[node], index[nxt])
    return out


def _cycle_in(scc: set[str], adj: dict[str, list[str]]) -> list[str]:
    """The shortest path from the component's first module back to itself (breadth first)."""
    start = min(scc)
    parent: dict[str, str] = {}
    frontier = [start]
    while frontier:
        nxt = []
        for node in frontier:
            for t in adj[node]:
                if t == start:
                    path = [node]
                    while path[-1] != start:
                        path.append(parent[path[-1]])
                    return path[::-1] + [start]
                if t in scc and t not in parent:
                    parent[t] = node
                    nxt.append(t)
        frontier = nxt
    raise AssertionError(f"no cycle in component {sorted(scc)}")


def upward_imports(graph: dict[str, dict[str, int]]) -> list[str]:
    """Each import of a libs/ module from services/ or radixmesh/, as ``module -> target (line n)``."""
    return [f"{mod} -> {target} (line {line})" for mod, edges in sorted(graph.items()) if mod.split(".")[0] == "libs"
            for target, line in sorted(edges.items()) if target.split(".")[0] != "libs"]


def describe(cycle: list[str], graph: dict[str, dict[str, int]]) -> str:
    return "\n    ".join(f"{a} -> {b} (line {graph[a][b]})" for a, b in zip(cycle, cycle[1:]))


def test_no_import_cycles():
    graph = import_graph(ROOT)
    assert len(graph) > 100 and graph["services.gateway.pipeline"]  # the walk found the project
    found = cycles(graph)
    assert not found, "import cycles (break them: move the shared type down, or pass a narrower protocol):\n  " + \
        "\n  ".join(f"{' -> '.join(c)}\n    {describe(c, graph)}" for c in found)


def test_libraries_import_no_service():
    found = upward_imports(import_graph(ROOT))
    assert not found, "libs/ imports from above it (move the code into the service, or the shared part " \
        "down into libs/):\n  " + "\n  ".join(found)


def test_finds_a_library_importing_a_service():
    graph = {"libs.a": {"libs.b": 1, "services.w.x": 4}, "libs.b": {}, "services.w.x": {"libs.a": 2},
             "radixmesh.cli": {"services.w.x": 1}}
    assert upward_imports(graph) == ["libs.a -> services.w.x (line 4)"]


def test_finds_guarded_local_and_relative_cycles(tmp_path):
    """The checker itself: cycles through TYPE_CHECKING, a function-local import, a relative import."""
    pkg = tmp_path / "libs" / "demo"
    pkg.mkdir(parents=True)
    (tmp_path / "libs" / "__init__.py").write_text("")
    (pkg / "__init__.py").write_text("from .a import A\n")
    (pkg / "a.py").write_text("from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from .b import B\nA = 1\n")
    (pkg / "b.py").write_text("def f():\n    from libs.demo import c\n")
    (pkg / "c.py").write_text("import libs.demo.a\nimport json\n")
    (pkg / "d.py").write_text("from . import a\n")  # into the cycle, not part of it
    graph = import_graph(tmp_path, ("libs",))
    assert graph["libs.demo"] == {"libs.demo.a": 1}
    assert graph["libs.demo.d"] == {"libs.demo.a": 1}
    assert cycles(graph) == [["libs.demo.a", "libs.demo.b", "libs.demo.c", "libs.demo.a"]]
    assert "libs.demo.b -> libs.demo.c (line 2)" in describe(cycles(graph)[0], graph)
