"""Every service's settings, derived from the run spec: what the services share is written once (in the spec)
and copied to each by the table of :data:`LINKS`; each service's own parts come from ``services.<name>`` of
the spec (a mapping or its settings file). A service setting given there that the spec (or ``fleetrl run``
itself) also sets, to another value, is an error naming both places.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from pydantic import BaseModel

from shared.run_settings import LEGACY, move_legacy
from shared.settings import SettingsError, read_config_file

from .spec import RunSpec

REUSED = ("data", "algorithm", "optim", "train")
"""Learner sections the spec reuses as they are: only what the spec sets in them is derived."""


@dataclass(frozen=True)
class Link:
    """The service setting ``service`` takes the value of the spec's ``spec`` (or of ``value(spec)``)."""

    spec: str
    service: str
    value: Callable[[RunSpec], Any] | None = None


def _sampling(prefix: str, fields: tuple[str, ...]) -> tuple[Link, ...]:
    return tuple(Link(f"sampling.{f}", f"{prefix}.{f}") for f in fields)


LINKS: dict[str, tuple[Link, ...]] = {
    "learner": (
        Link("run_name", "run_name"), Link("model", "model.actor"), *(Link(s, s) for s in REUSED),
        Link("sampling.group_size", "rollout.group_size"),
        *_sampling("rollout.sampling", ("max_new_tokens", "temperature", "top_p", "top_k", "stop")),
        Link("staleness", "run.max_staleness"), Link("window", "rollout.window", lambda s: s.group_window),
        Link("checkpoint_every", "checkpoint.every"), Link("export", "checkpoint.export_dir"),
        # a preference run (rm, dpo) measures its held-out pairs itself
        Link("eval.data", "data.eval_path", lambda s: s.eval.data if s.heldout_pairs else None),
        Link("eval.every", "algorithm.eval_every", lambda s: s.eval.every if s.heldout_pairs else None),
        Link("eval.max_samples", "algorithm.eval_max_pairs", lambda s: s.eval.max_samples if s.heldout_pairs else None),
    ),
    "rollout": (
        Link("run_name", "run_name"), Link("model", "model"), Link("staleness", "run.max_staleness"),
        *_sampling("worker.sampling", ("max_new_tokens", "temperature", "top_p", "top_k", "min_p", "stop")),
    ),
    "reward": (Link("reward.scorers", "scorers"),),
}

FLEET_OWNED: dict[str, tuple[str, ...]] = {
    "learner": ("host", "port", "redis_url", "control_token", "run_key", "run_dir", "checkpoint.dir", "exit_when_done",
                "observability.run_config"),
    "rollout": ("host", "port", "redis_url", "control_token", "run_key", "worker.enabled", "worker.reward_url",
                "worker.consumer_name", "worker.reward_token"),
    "reward": ("host", "port", "auth_token"),
}
"""Settings ``fleetrl run`` gives each process itself (where it listens, where Redis and the reward are)."""


def get_path(tree: Any, dotted: str) -> tuple[bool, Any]:
    node = tree
    for part in dotted.split("."):
        if not isinstance(node, dict) or part not in node:
            return False, None
        node = node[part]
    return True, node


def set_path(tree: dict, dotted: str, value: Any) -> None:
    *parents, last = dotted.split(".")
    for part in parents:
        tree = tree.setdefault(part, {})
    tree[last] = value


def leaves(tree: Any, prefix: str = "") -> dict[str, Any]:
    """Dotted path -> value of every leaf (lists are leaves)."""
    if not isinstance(tree, dict) or not tree:
        return {prefix: tree} if prefix else {}
    out: dict[str, Any] = {}
    for key, value in tree.items():
        out.update(leaves(value, f"{prefix}.{key}" if prefix else str(key)))
    return out


def deep_merge(base: dict, top: dict) -> dict:
    out = dict(base)
    for key, value in top.items():
        out[key] = deep_merge(out[key], value) if isinstance(value, dict) and isinstance(out.get(key), dict) else value
    return out


def _spec_value(spec: RunSpec, link: Link, full: dict, set_only: dict) -> tuple[bool, Any]:
    if link.value is not None:
        return True, link.value(spec)
    head = link.spec.split(".", 1)[0]
    return get_path(set_only if head in REUSED else full, link.spec)


def derived(spec: RunSpec, service: str) -> tuple[dict[str, Any], dict[str, str]]:
    """(the settings ``service`` takes from the spec, service leaf path -> the spec setting it comes from)."""
    full = spec.model_dump(mode="json")
    set_only = spec.model_dump(mode="json", exclude_unset=True)
    out: dict[str, Any] = {}
    origin: dict[str, str] = {}
    for link in LINKS[service]:
        found, value = _spec_value(spec, link, full, set_only)
        if not found or value is None:
            continue
        set_path(out, link.service, value)
        for leaf in leaves(value, link.service) or {link.service: value}:
            origin[leaf] = link.spec + leaf[len(link.service):]
    return out, origin


def own_settings(spec: RunSpec, service: str) -> tuple[dict[str, Any], str]:
    """The service's own part (``services.<service>``) and where it was written."""
    own = getattr(spec.services, service)
    if own is None:
        return {}, ""
    if isinstance(own, str):
        try:
            return read_config_file(own), own
        except SettingsError as exc:
            raise SettingsError(f"services.{service}: {exc}") from exc
    return dict(own), f"services.{service}"


def check_agreement(service: str, own: dict[str, Any], where: str, ours: dict[str, Any], origin: dict[str, str],
                    spec_file: str) -> None:
    """Raise SettingsError (one line per contradiction) where the service's own settings contradict the spec."""
    problems = []
    fleet = FLEET_OWNED[service]
    spec_leaves = leaves(ours)
    for path, value in leaves(own).items():
        if any(path == f or path.startswith(f"{f}.") for f in fleet):
            problems.append(f"{where}: {service} setting {path} is set by fleetrl run itself; remove it")
        elif path in spec_leaves and spec_leaves[path] != value:
            problems.append(f"{where}: {service} setting {path} = {value!r} contradicts the run spec's "
                            f"{origin.get(path, path)} = {spec_leaves[path]!r} ({spec_file}); set it in one place")
    if problems:
        raise SettingsError("\n".join(problems))


def service_config(spec: RunSpec, service: str, spec_file: str | Path = "the run spec") -> dict[str, Any]:
    """The settings mapping of ``service`` (without what ``fleetrl run`` adds per process)."""
    own, where = own_settings(spec, service)
    ours, origin = derived(spec, service)
    if service in LEGACY:
        try:
            own = move_legacy(service, own, logging.getLogger("deploy.run").warning)
        except ValueError as exc:
            raise SettingsError(f"{where}: {exc}") from exc
        shared_run = run_wide(spec)
        if shared_run:  # what one service's own settings give the run, every service gets (the spec wins)
            ours = deep_merge({"run": shared_run}, ours)
    check_agreement(service, own, where, ours, origin, str(spec_file))
    return with_plugins(spec, deep_merge(own, ours))


def run_wide(spec: RunSpec) -> dict[str, Any]:
    """The ``run`` section the services' own settings give (their former places of it included), which every
    service of the run must hold alike (shared/run_settings.py): two services giving one field different values is
    a SettingsError naming both."""
    out: dict[str, Any] = {}
    given: dict[str, str] = {}
    for service in LEGACY:
        own, where = own_settings(spec, service)
        try:
            run = move_legacy(service, own).get("run") if own else None
        except ValueError as exc:
            raise SettingsError(f"{where}: {exc}") from exc
        for name, value in (run or {}).items() if isinstance(run, dict) else ():
            if name in out and str(out[name]) != str(value):
                raise SettingsError(f"{given[name]} sets run.{name} = {out[name]!r} but {where} sets {value!r}: "
                                    "every service of a run holds the same run-wide settings; set it once")
            out[name], given[name] = value, where
    return out


def with_plugins(spec: RunSpec, config: dict[str, Any]) -> dict[str, Any]:
    """``config`` with the spec's ``plugins`` and ``sys_path`` first, then the service's own (each once): every
    service registers the kinds the spec names (a service section may add its own)."""
    out = dict(config)
    for key, ours in (("plugins", spec.plugins), ("sys_path", spec.sys_path or [])):
        own = out.get(key) or []
        if isinstance(own, list) and (ours or own):
            out[key] = list(dict.fromkeys([*ours, *own]))
    return out


def validate(service_cls: type[BaseModel], service: str, config: dict[str, Any],
             spec: RunSpec | None = None) -> BaseModel:
    """Build the service's settings from ``config`` as its process will; SettingsError names the setting: by the
    spec's own path (``services.rollout.engin: unknown setting``) when ``spec``'s ``services.<service>`` wrote it,
    else as the service's setting (``rollout settings: ...``)."""
    from shared.settings import load_settings

    try:
        return load_settings(service_cls, **config)
    except SettingsError as exc:
        own, where = own_settings(spec, service) if spec is not None else ({}, "")
        body = str(exc).split("\n", 1)[-1]
        lines = [line.strip().replace(": Value error, ", ": ") for line in body.splitlines() if line.strip()]
        raise SettingsError("\n".join(_named(service, line, own, where) for line in lines)) from exc


def _named(service: str, line: str, own: dict[str, Any], where: str) -> str:
    """A service's settings error named where the user wrote the setting, when they did (``services.rollout`` of
    the spec, or the file it names), or by the spec's own name of a setting derived from it (the learner's
    ``rollout.group_size`` is the spec's ``sampling.group_size``)."""
    key = line.split(":", 1)[0].strip()
    node: Any = own
    for part in key.split("."):
        if not isinstance(node, dict) or part not in node:
            return _in_spec_terms(service, line) or f"{service} settings: {line}"
        node = node[part]
    if where.startswith("services."):
        return f"{where}.{line}"
    return f"{where}: {line}"


def _in_spec_terms(service: str, line: str) -> str | None:
    """``line`` with every service setting the spec derives as it is (a :data:`LINKS` entry) written by the spec's
    name, and named by the first of them when pydantic named none (``<root>``); None when it names no such
    setting. ``learner settings: <root>: grpo compares samples within a group: set rollout.group_size >= 2`` named
    a setting the spec's user never wrote."""
    import re

    key, _, rest = line.partition(":")
    key, named = key.strip(), None
    for link in LINKS.get(service, ()):
        if link.service == link.spec:
            continue
        pattern = rf"(?<![\w.]){re.escape(link.service)}(?![\w.])"
        if re.fullmatch(pattern, key) or re.search(pattern, rest):
            key = link.spec if re.fullmatch(pattern, key) else key
            rest = re.sub(pattern, link.spec, rest)
            named = named or link.spec
    if named is None:
        return None
    return f"{named if key == '<root>' else key}:{rest}"
