"""What each image in deploy/docker/ copies: everything the commands it runs import, and nothing else of ours.

An image's commands are its Dockerfile's ENTRYPOINT and CMD plus every command docker-compose.yml and the
Kubernetes manifests run on it (``python -m X``). Their import closure is computed from the source (ast, our
own packages ``shared`` / ``services`` / ``deploy``): every ``import`` anywhere in a file (lazy imports in
functions included) and every string that names one of our modules (``"services.reward.scorers.rule:RuleScorer"``
in a plug-in registry, ``"services.reward.scorers.python_worker"`` started with ``-m``), so the plug-ins that
registries import by name are in it.

- every image copies its whole closure (a module missing from an image is a ``ModuleNotFoundError`` at start:
  the compose stack's init container died of one);
- a service image copies ``shared/``, ``services/__init__.py``, its own ``services/<name>/`` and exactly the
  ``deploy/`` files its closure holds (the entrypoint): no other service, no ``deploy/`` folder it does not run;
- no image copies a ``deploy/`` folder none of its commands import, nor data its code does not name;
- each command starts (``--help``) from the image's files alone, assembled from its ``COPY`` lines.

Checked without a container engine; ``make compose-test`` builds and runs the images for real."""

from __future__ import annotations

import ast
import json
import os
import re
import shutil
import subprocess
import sys
import sysconfig
from functools import cache
from pathlib import Path

import pytest
import yaml

REPO = Path(__file__).resolve().parents[2]
OURS = ("shared", "services", "deploy")
COMPOSE = yaml.safe_load((REPO / "docker-compose.yml").read_text())["services"]
K8S = [d for p in sorted((REPO / "deploy/k8s").glob("*.yaml")) for d in yaml.safe_load_all(p.read_text()) if d]
DOCKERFILES = sorted(p for p in (REPO / "deploy/docker").glob("*.Dockerfile") if p.name != "base.Dockerfile")
BUILD_ONLY = {"pyproject.toml"}  # copied to /tmp to install dependencies, not code the image runs
# a whole string that names one of our modules, optionally ``:attr`` (the registries' "module:attr" form)
MODULE_STRING = re.compile(r"^((?:shared|services|deploy)(?:\.[A-Za-z_]\w*)+)(?::[\w.]+)?$")


# ---- the import closure --------------------------------------------------------------------------------------

def module_file(name: str) -> Path | None:
    base = REPO.joinpath(*name.split("."))
    for candidate in (base.with_suffix(".py"), base / "__init__.py"):
        if candidate.is_file():
            return candidate
    return None  # a name imported from a module (a function, a class), or not ours


def module_name(path: Path) -> str:
    parts = path.relative_to(REPO).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


@cache
def references(path: Path, eager_only: bool = False) -> frozenset[tuple[str, str]]:
    """``(module, how)`` for each of our modules ``path`` names: ``how`` is ``import`` or ``string``.

    ``eager_only``: just the imports that run when the module is imported (none inside a function, no strings)."""
    me = module_name(path)
    package = me if path.name == "__init__.py" else me.rpartition(".")[0]
    out: set[tuple[str, str]] = set()
    tree = ast.parse(path.read_text())
    lazy = {id(n) for f in ast.walk(tree) if isinstance(f, (ast.FunctionDef, ast.AsyncFunctionDef))
            for n in ast.walk(f)} if eager_only else set()
    for node in ast.walk(tree):
        if id(node) in lazy or (eager_only and isinstance(node, ast.Constant)):
            continue
        if isinstance(node, ast.Import):
            out.update((a.name, "import") for a in node.names)
        elif isinstance(node, ast.ImportFrom):
            if node.level:  # from . import x / from ..y import z
                parent = package.split(".")[: len(package.split(".")) - node.level + 1]
                module = ".".join(parent + ([node.module] if node.module else []))
            else:
                module = node.module or ""
            out.add((module, "import"))
            out.update((f"{module}.{a.name}", "import") for a in node.names)
        elif isinstance(node, ast.Constant) and isinstance(node.value, str) and (m := MODULE_STRING.match(node.value)):
            out.add((m.group(1), "string"))
    return frozenset((n, how) for n, how in out if n.split(".")[0] in OURS)


def closure(roots: list[str], eager_only: bool = False) -> dict[Path, str]:
    """Every file of ours that importing (or ``-m`` running) ``roots`` can load -> the name that brought it in.

    A module's parent packages come with it (their ``__init__``); a package named by a string comes with its
    ``__main__`` too (strings name what is started with ``python -m``). ``eager_only``: what importing
    ``roots`` loads at once (see ``references``)."""
    seen: dict[Path, str] = {}
    todo = [(r, "string") for r in roots]
    while todo:
        name, how = todo.pop()
        parts = name.split(".")
        files = [module_file(".".join(parts[:i])) for i in range(1, len(parts) + 1)]
        if how == "string" and files[-1] is not None and files[-1].name == "__init__.py":
            files.append(module_file(f"{name}.__main__"))
        for f in files:
            if f is not None and f not in seen:
                seen[f] = name
                todo += references(f, eager_only)
    return seen


# ---- what an image runs and what it copies -------------------------------------------------------------------

def python_modules(cmd: list[str] | str | None) -> list[str]:
    """The modules a command runs: each ``-m X`` (``python -m``, ``torchrun ... -m``)."""
    args = cmd.split() if isinstance(cmd, str) else list(cmd or [])
    return [args[i + 1] for i, a in enumerate(args[:-1]) if a == "-m"]


def instruction(text: str, name: str) -> list[str]:
    m = re.search(rf"^{name} (\[.*\])$", text, re.MULTILINE)
    return json.loads(m.group(1)) if m else []


def image_names(dockerfile: Path) -> set[str]:
    """The names docker-compose.yml gives the image it builds from ``dockerfile`` (``${VAR:-name}`` -> name)."""
    return {re.sub(r"^\$\{\w+:-([^}]+)\}$", r"\1", svc["image"]) for svc in COMPOSE.values()
            if (svc.get("build") or {}).get("dockerfile") == dockerfile.relative_to(REPO).as_posix()}


def commands(dockerfile: Path) -> dict[str, list[str]]:
    """Where each module run on this image is run from -> the modules (Dockerfile, compose services, k8s)."""
    text = dockerfile.read_text()
    names = image_names(dockerfile) or {f"fleetrl-{dockerfile.name.removesuffix('.Dockerfile')}"}
    out = {dockerfile.name: python_modules(instruction(text, "ENTRYPOINT") + instruction(text, "CMD"))}
    for name, svc in COMPOSE.items():
        if re.sub(r"^\$\{\w+:-([^}]+)\}$", r"\1", svc.get("image", "")) in names:
            out[f"docker-compose.yml:{name}"] = python_modules(svc.get("command")) + python_modules(svc.get("entrypoint"))
    for doc in K8S:
        for c in (doc.get("spec", {}).get("template", {}).get("spec", {}) or {}).get("containers", []):
            if c["image"].split(":")[0] in names:
                out[f"k8s:{doc['metadata']['name']}"] = python_modules(c.get("command", []) + c.get("args", []))
    return out


def roots(dockerfile: Path) -> list[str]:
    return sorted({m for mods in commands(dockerfile).values() for m in mods})


def copies(text: str) -> list[Path]:
    """The repo paths a Dockerfile's ``COPY`` lines put under /app (build inputs copied elsewhere left out)."""
    out: list[Path] = []
    for line in text.splitlines():
        if not line.startswith("COPY ") or "--from=" in line:
            continue
        *sources, dest = [a for a in line.split()[1:] if not a.startswith("--")]
        if not dest.startswith("/app"):
            assert all(s in BUILD_ONLY for s in sources), f"{line!r}: code belongs under /app"
            continue
        for src in sources:
            out += sorted(REPO.glob(src)) if any(c in src for c in "*?[") else [REPO / src]
    return out


def python_files(paths: list[Path]) -> set[Path]:
    return {f for p in paths for f in ([p] if p.is_file() else p.rglob("*.py")) if f.suffix == ".py"}


def own_service(dockerfile: Path) -> str | None:
    """``reward`` for an image whose CMD runs ``services.reward``; None for an image that runs no service."""
    cmd = python_modules(instruction(dockerfile.read_text(), "CMD"))
    services = {m.split(".")[1] for m in cmd if m.startswith("services.")}
    assert len(services) <= 1, f"{dockerfile.name} runs {services}"
    return next(iter(services), None)


def unneeded(text: str, run: list[str], service: str | None) -> list[str]:
    """What a Dockerfile (``text``) copies that the modules it runs (``run``) do not need.

    A service image: ``shared/``, ``services/__init__.py``, ``services/<service>/`` and the ``deploy/`` files in
    the closure, nothing more. Any image: no ``deploy/`` folder without a module in the closure, no other
    service, no data folder the closure's code does not name."""
    needed = closure(run)
    named = "\n".join(f.read_text() for f in needed)
    out = []
    for path in copies(text):
        rel = path.relative_to(REPO)
        top = rel.parts[0]
        if top == "shared" or rel.as_posix() == "services/__init__.py":
            continue
        if top == "services":
            if service is not None and (len(rel.parts) < 2 or rel.parts[1] != service):
                out.append(f"{rel} (another service)")
            elif len(rel.parts) < 2:  # all of services/: each one must run
                out += [f"{p.relative_to(REPO)} (nothing in it runs)" for p in sorted(path.iterdir())
                        if p.is_dir() and (p / "__init__.py").is_file() and not any(p in f.parents for f in needed)]
            elif not any(f == path or path in f.parents for f in needed):
                out.append(f"{rel} (nothing in it runs)")
        elif top == "deploy":
            if path.is_dir():
                if not any(path in f.parents for f in needed):
                    out.append(f"{rel}/ (nothing in it runs)")
                elif service is not None:
                    out += [f"{f.relative_to(REPO)} (not run)" for f in sorted(python_files([path])) if f not in needed]
            elif path.suffix == ".py" and path not in needed:
                out.append(f"{rel} (not run)")
        elif path.name not in named:
            out.append(f"{rel} (no code it runs names it)")
    return out


# ---- the tests -----------------------------------------------------------------------------------------------

def test_the_closure_follows_lazy_imports_and_the_registries_module_strings():
    reward = closure(["services.reward"])
    assert REPO / "services/reward/__main__.py" in reward  # a package run with -m
    assert REPO / "services/reward/scorers/hf_rm.py" in reward  # "services.reward.scorers.hf_rm:HfRmScorer"
    assert REPO / "services/reward/scorers/python_worker.py" in reward  # [python, -m, "services.reward.scorers..."]
    rollout = closure(["services.rollout"])
    for plugin in ("engines/vllm", "engines/sglang", "agents/envs/calculator", "agents/openai_agent"):
        assert module_file("services.rollout." + plugin.replace("/", ".")) in rollout, plugin
    learner = closure(["services.learner"])
    assert REPO / "services/learner/algorithms/rl_algorithms.py" in learner
    assert not {f for f in reward | rollout | learner if f.relative_to(REPO).parts[0] == "deploy"}


@pytest.mark.parametrize("path", DOCKERFILES, ids=lambda p: p.name)
def test_every_image_runs_something_and_copies_the_whole_closure_of_it(path):
    """Everything the image's commands can import, and everything the code copied into it imports when it is
    imported (a lazy import in a copied module nothing runs is not followed), is copied
    (deploy/private_files.py, new in deploy/, was missing from every image: the init container died of it)."""
    copied = copies(path.read_text())
    assert roots(path), f"{path.name}: no python -m command runs on it"
    need = closure(roots(path)) | closure([module_name(f) for f in python_files(copied)], eager_only=True)
    missing = sorted(f"{f.relative_to(REPO)} (for {name})" for f, name in need.items()
                     if not any(f == c or c in f.parents for c in copied))
    assert not missing, f"{path.name} does not copy: {missing}"


@pytest.mark.parametrize("path", DOCKERFILES, ids=lambda p: p.name)
def test_each_image_copies_only_what_it_runs(path):
    extra = unneeded(path.read_text(), roots(path), own_service(path))
    assert not extra, f"{path.name} copies what {roots(path)} do not need: {extra}"


@pytest.mark.parametrize("path", [p for p in DOCKERFILES if own_service(p)], ids=lambda p: p.name)
def test_a_service_image_runs_no_other_service_and_no_deploy_code_but_the_entrypoint(path):
    """No service imports another, by ``import`` or by a module string (a plug-in registry, ``-m``)."""
    service = own_service(path)
    reached = {f.relative_to(REPO).parts[:2] for f in closure(roots(path))}
    others = sorted("/".join(p) for p in reached if p[0] == "services" and len(p) > 1
                    and p[1] not in (service, "__init__.py"))
    assert not others, f"{path.name} ({service}) reaches {others}"
    deploy = sorted(f.relative_to(REPO).as_posix() for f in closure(roots(path)) if f.parts[len(REPO.parts)] == "deploy")
    assert deploy == ["deploy/__init__.py", "deploy/docker/__init__.py", "deploy/docker/entrypoint.py"]


def test_the_check_catches_an_image_that_copies_the_whole_tree():
    """The Dockerfiles before issue 29 copied every service and most of deploy/ into every service image."""
    before = """\
COPY pyproject.toml /tmp/pyproject.toml
COPY shared /app/shared
COPY services /app/services
COPY deploy/*.py /app/deploy/
COPY deploy/local /app/deploy/local
COPY deploy/run /app/deploy/run
COPY examples/sort-digits /app/examples/sort-digits
COPY deploy/docker/__init__.py deploy/docker/entrypoint.py /app/deploy/docker/
"""
    extra = unneeded(before, ["deploy.docker.entrypoint", "services.reward"], "reward")
    assert {"services (another service)", "deploy/local/ (nothing in it runs)", "deploy/run/ (nothing in it runs)",
            "deploy/cli.py (not run)", "examples/sort-digits (no code it runs names it)"} <= set(extra), extra
    assert not unneeded(before.replace("COPY services /app/services", "COPY services/reward /app/services/reward")
                        .replace("COPY deploy/*.py", "COPY deploy/__init__.py deploy/private_files.py"),
                        ["deploy.docker.entrypoint", "deploy.compose.prepare"], None)


def test_compose_and_k8s_run_each_command_on_an_image_that_has_it():
    """Every image docker-compose.yml or the manifests name is built from a Dockerfile here (or is Redis)."""
    built = {n for p in DOCKERFILES for n in image_names(p)}
    used = {re.sub(r"^\$\{\w+:-([^}]+)\}$", r"\1", s["image"]) for s in COMPOSE.values()}
    used |= {c["image"].split(":")[0] for d in K8S for c in
             (d.get("spec", {}).get("template", {}).get("spec", {}) or {}).get("containers", [])}
    assert {u for u in used if not u.startswith("redis")} <= built


def assemble(dockerfile: Path, into: Path) -> None:
    """The image's /app, built the way its ``COPY`` lines build it (a folder's contents, files into a folder)."""
    for line in dockerfile.read_text().splitlines():
        if not line.startswith("COPY ") or "--from=" in line:
            continue
        *sources, dest = [a for a in line.split()[1:] if not a.startswith("--")]
        if not dest.startswith("/app"):
            continue
        target = into / dest.removeprefix("/app").strip("/")
        paths = [p for s in sources for p in (sorted(REPO.glob(s)) if any(c in s for c in "*?[") else [REPO / s])]
        for p in paths:
            if p.is_dir():
                shutil.copytree(p, target, dirs_exist_ok=True, ignore=shutil.ignore_patterns("__pycache__"))
            else:
                folder = target if dest.endswith("/") or len(paths) > 1 else target.parent
                folder.mkdir(parents=True, exist_ok=True)
                shutil.copy2(p, folder / (p.name if folder == target else target.name))


@pytest.mark.process
@pytest.mark.parametrize("path", DOCKERFILES, ids=lambda p: p.name)
def test_every_command_starts_from_the_files_the_image_copies(path, tmp_path):
    """The image's files alone on ``sys.path`` (no checkout, no editable install: ``python -S`` with the
    dependencies' site-packages only): each module its commands run starts (``--help``; the entrypoint runs
    ``true``). A module the image lacks is a ``ModuleNotFoundError`` here, as it would be in the container."""
    assemble(path, tmp_path)
    site = {sysconfig.get_paths()["purelib"], sysconfig.get_paths()["platlib"]}
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(tmp_path), *sorted(site)]), "FLEETRL_WAIT_FOR": ""}
    for module in roots(path):
        args = ["true"] if module == "deploy.docker.entrypoint" else ["--help"]
        res = subprocess.run([sys.executable, "-S", "-m", module, *args], cwd=tmp_path, env=env, check=False,
                             capture_output=True, text=True, timeout=120)
        assert res.returncode == 0, f"{path.name}: python -m {module} {' '.join(args)}:\n{res.stderr[-2000:]}"
