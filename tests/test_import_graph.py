"""The import graph of the packages has no cycle: a module that needs a module importing it back is a seam
drawn the wrong way round (a base class importing its implementations, say). Every import statement counts,
function-level (lazy) ones included: a lazy import hides a cycle from the interpreter, not from the reader."""

from __future__ import annotations

import ast
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
PACKAGES = ("services", "shared", "deploy")


def modules() -> dict[str, Path]:
    out = {}
    for pkg in PACKAGES:
        for path in (REPO / pkg).rglob("*.py"):
            parts = list(path.relative_to(REPO).with_suffix("").parts)
            if parts[-1] == "__init__":
                parts.pop()
            out[".".join(parts)] = path
    return out


def import_graph(mods: dict[str, Path]) -> dict[str, set[str]]:
    """Module -> the modules of ours it imports (the most specific one that exists)."""

    def known(name: str) -> str | None:
        while name and name not in mods:
            name = name.rpartition(".")[0]
        return name or None

    graph: dict[str, set[str]] = {m: set() for m in mods}
    for mod, path in mods.items():
        package = mod.split(".") if path.name == "__init__.py" else mod.split(".")[:-1]
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.Import):
                targets = [known(a.name) for a in node.names]
            elif isinstance(node, ast.ImportFrom):
                base = node.module or ""
                if node.level:
                    base = ".".join(package[: len(package) - node.level + 1] + ([node.module] if node.module else []))
                targets = [known(f"{base}.{a.name}") if f"{base}.{a.name}" in mods else known(base)
                           for a in node.names]
            else:
                continue
            graph[mod] |= {t for t in targets if t is not None and t != mod}
    return graph


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components of more than one module (Tarjan, iterative)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []
    for root, edges in graph.items():
        if root in index:
            continue
        work = [(root, iter(sorted(edges)))]
        index[root] = low[root] = len(index)
        stack.append(root)
        on_stack.add(root)
        while work:
            node, children = work[-1]
            child = next(children, None)
            if child is not None:
                if child not in index:
                    index[child] = low[child] = len(index)
                    stack.append(child)
                    on_stack.add(child)
                    work.append((child, iter(sorted(graph[child]))))
                elif child in on_stack:
                    low[node] = min(low[node], index[child])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[node])
            if low[node] == index[node]:
                component = []
                while True:
                    member = stack.pop()
                    on_stack.discard(member)
                    component.append(member)
                    if member == node:
                        break
                if len(component) > 1:
                    found.append(sorted(component))
    return found


def test_the_checker_finds_a_cycle():
    assert cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]
    assert cycles({"a": {"b"}, "b": set()}) == []


def test_no_import_cycles():
    graph = import_graph(modules())
    assert "services.learner.training.backends.base" in graph  # the walk sees the packages
    found = cycles(graph)
    detail = "\n".join(
        " <-> ".join(c) + "\n    " + "\n    ".join(f"{m} -> {sorted(graph[m] & set(c))}" for m in c) for c in found
    )
    assert not found, f"import cycles:\n{detail}"


def layer_violations(graph: dict[str, set[str]]) -> list[str]:
    """Imports against the layers ``shared`` <- ``services`` <- ``deploy``: shared imports neither services nor
    deploy, a service imports no deploy module and no other service (they meet only in shared)."""
    out = []
    for mod, targets in graph.items():
        top = mod.split(".")[:2]
        for t in sorted(targets):
            head = t.split(".")[:2]
            if top[0] == "shared" and head[0] in ("services", "deploy"):
                out.append(f"{mod} -> {t} (shared holds contracts: it imports no service and no launcher)")
            elif top[0] == "services" and head[0] == "deploy":
                out.append(f"{mod} -> {t} (a service takes what it needs as settings, never from deploy)")
            elif top[0] == "services" and head[0] == "services" and len(top) > 1 and len(head) > 1 and top[1] != head[1]:
                out.append(f"{mod} -> {t} (no service imports another: they meet in shared)")
    return out


def test_layers_point_one_way():
    assert not layer_violations(import_graph(modules()))


def test_the_layer_check_catches_each_kind_of_back_arrow():
    graph = {"shared.a": {"services.learner.x"}, "services.rollout.y": {"deploy.run.z", "services.learner.x"},
             "deploy.run.z": {"services.rollout.y", "shared.a"}, "services.learner.x": {"shared.a"}}
    found = layer_violations(graph)
    assert len(found) == 3 and all("deploy.run.z ->" not in f for f in found)
