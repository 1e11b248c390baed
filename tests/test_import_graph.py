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


# ---- inside the rollout service: its parts import one way ------------------------------------------------------
ROLLOUT = "services.rollout"
ROLLOUT_LAYERS: tuple[tuple[str, ...], ...] = (
    ("engines",),  # generation: prompt ids in, output ids + logprobs out
    ("errors", "metrics", "chat_templates", "chat_tokens", "reward_client",  # small pieces several parts share
     "trajectory", "experiences"),  # and the records both producers write (the worker, a session's finish)
    ("weights",),  # the weight sidecar: new versions into the engine
    ("sessions",),  # an agent's OpenAI-API calls recorded as trajectories
    ("worker",),  # prompts stream -> rollout function -> experiences stream; the rollout-function contract
    ("agents",),  # rollout functions over that contract: multi-turn environments and tools, agent programs
    ("settings",),  # the service's settings, put together from each part's section
    ("service",),  # the service object: the parts started in order, admission, tokenisation
    ("protocols",),  # HTTP request bodies <-> engine sequences, no FastAPI
    ("deps",),
    ("routes",),  # HTTP
    ("app",),
    ("cli", "__main__"),
)
"""The rollout service's folders and top-level modules, bottom first: each imports only what stands below it (or
beside it, one way). docs/rollout.md ("How the service is built") says why this order."""

ROLLOUT_BACK_ARROWS: frozenset[tuple[str, str]] = frozenset()
"""(part, part) arrows allowed to point back up: at most 2, each with its reason beside it. Today none."""


def rollout_arrows(graph: dict[str, set[str]]) -> dict[tuple[str, str], list[str]]:
    """Part -> part arrows inside the rollout service (a part: a folder or a top-level module), each with the
    module imports that make it."""

    def part(mod: str) -> str | None:
        rest = mod.split(".")[2:] if mod.startswith(ROLLOUT + ".") or mod == ROLLOUT else None
        return None if rest is None else (rest[0] if rest else "__init__")

    out: dict[tuple[str, str], list[str]] = {}
    for mod, targets in graph.items():
        a = part(mod)
        for t in sorted(targets):
            b = part(t)
            if a is not None and b is not None and a != b:
                out.setdefault((a, b), []).append(f"{mod} -> {t}")
    return out


def back_arrows(arrows: dict[tuple[str, str], list[str]],
                layers: tuple[tuple[str, ...], ...] = ROLLOUT_LAYERS) -> dict[tuple[str, str], list[str]]:
    """The arrows that point up the layers (or both ways between two parts of one layer); a part on no layer
    makes an arrow of its own, (part, "<no layer>"), so that a new folder is placed before it is used."""
    level = {p: i for i, layer in enumerate(layers) for p in layer}
    out: dict[tuple[str, str], list[str]] = {}
    for (a, b), why in arrows.items():
        for p in (a, b):
            if p not in level and p != "__init__":
                out[(p, "<no layer>")] = why
        if a in level and b in level and (level[b] > level[a] or (level[b] == level[a] and (b, a) in arrows)):
            out[(a, b)] = why
    return out


def rollout_parts() -> set[str]:
    return {m.split(".")[2] for m in modules() if m.startswith(ROLLOUT + ".")}


def test_every_rollout_part_stands_on_one_layer():
    placed = [p for layer in ROLLOUT_LAYERS for p in layer]
    assert len(placed) == len(set(placed)), "a part on two layers"
    assert rollout_parts() == set(placed), (f"not placed: {sorted(rollout_parts() - set(placed))}; "
                                            f"placed but gone: {sorted(set(placed) - rollout_parts())}")


def test_rollout_parts_import_one_way():
    arrows = rollout_arrows(import_graph(modules()))
    assert ("service", "worker") in arrows and ("agents", "worker") in arrows  # the walk sees the parts
    back = back_arrows(arrows)
    new = {k: v for k, v in back.items() if k not in ROLLOUT_BACK_ARROWS}
    assert not new, "rollout imports back up the layers (tests/test_import_graph.py, ROLLOUT_LAYERS):\n" + "\n".join(
        f"  {a} -> {b}: {', '.join(why)}" for (a, b), why in sorted(new.items()))
    assert len(ROLLOUT_BACK_ARROWS) <= 2
    assert ROLLOUT_BACK_ARROWS <= set(back), f"allowed but gone (strike them): {sorted(ROLLOUT_BACK_ARROWS - set(back))}"


def test_the_rollout_check_catches_an_arrow_back_up():
    graph = {
        "services.rollout.worker.loop": {"services.rollout.agents.multi_turn", "services.rollout.engines.types"},
        "services.rollout.agents.multi_turn": {"services.rollout.worker.contract"},
        "services.rollout.worker.contract": {"services.rollout.chat_tokens"},
        "services.rollout.chat_tokens": set(),
        "services.rollout.engines.types": set(),
        "services.rollout.newpart.x": {"services.rollout.engines.types"},
        "services.rollout.metrics": {"services.rollout.errors"},
        "services.rollout.errors": {"services.rollout.metrics", "shared.schemas"},
    }
    back = back_arrows(rollout_arrows(graph))
    assert set(back) == {("worker", "agents"), ("newpart", "<no layer>"),
                         ("metrics", "errors"), ("errors", "metrics")}
    assert back[("worker", "agents")] == ["services.rollout.worker.loop -> services.rollout.agents.multi_turn"]
    graph["services.rollout.errors"] = {"shared.schemas"}  # beside each other, one way: fine
    graph["services.rollout.worker.loop"] = {"services.rollout.engines.types"}
    assert set(back_arrows(rollout_arrows(graph))) == {("newpart", "<no layer>")}
