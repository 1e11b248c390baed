"""Settings base for every service: typed, read from a YAML/TOML file and from the environment.

Precedence (highest first): explicit overrides (CLI flags) > environment (``FLEETRL_<SERVICE>_*``) >
the config file > the few conventional un-prefixed variables a class accepts (``fallback_env``:
``$REDIS_URL`` for ``redis_url``) > defaults. Unknown keys anywhere are an error that names the key, never
ignored. This module is the only place that reads the environment for a setting.

Usage::

    class RolloutSettings(ServiceSettings):
        model_config = service_config("ROLLOUT")
        model: str = Field(description="...")

    settings = load_settings(RolloutSettings, config_file="rollout.yaml", port=8001)
"""

from __future__ import annotations

import contextvars
import difflib
import os
from pathlib import Path
from typing import Any, ClassVar, TypeVar

import tomllib
import yaml
from pydantic import Field, SecretStr, ValidationError, field_validator
from pydantic.fields import FieldInfo
from pydantic_settings import BaseSettings, PydanticBaseSettingsSource, SettingsConfigDict

_config_file: contextvars.ContextVar[Path | None] = contextvars.ContextVar("fleetrl_config_file", default=None)

S = TypeVar("S", bound=BaseSettings)


class SettingsError(ValueError):
    """Settings could not be loaded; the message says which key and how to fix it."""


def read_config_file(path: str | Path) -> dict[str, Any]:
    """Read a YAML (.yaml/.yml) or TOML (.toml) mapping."""
    p = Path(path)
    if not p.is_file():
        raise SettingsError(f"config file {p} does not exist")
    text = p.read_text()
    try:
        if p.suffix == ".toml":
            data = tomllib.loads(text)
        elif p.suffix in (".yaml", ".yml", ".json"):
            data = yaml.safe_load(text) or {}
        else:
            raise SettingsError(f"config file {p}: use .yaml, .yml, .json or .toml")
    except (yaml.YAMLError, tomllib.TOMLDecodeError) as exc:
        raise SettingsError(f"config file {p} is not valid: {exc}") from exc
    if not isinstance(data, dict):
        raise SettingsError(f"config file {p} must hold a mapping of settings, got {type(data).__name__}")
    return data


class _ConfigFileSource(PydanticBaseSettingsSource):
    def get_field_value(self, field: FieldInfo, field_name: str) -> tuple[Any, str, bool]:  # pragma: no cover
        return None, field_name, False

    def __call__(self) -> dict[str, Any]:
        path = _config_file.get()
        return read_config_file(path) if path is not None else {}


class _FallbackEnvSource(PydanticBaseSettingsSource):
    """The conventional un-prefixed variables a settings class accepts (``fallback_env``), below its file: a
    machine-wide ``$REDIS_URL`` never overrides what a run's own flags, variables or file say. Empty is unset."""

    def get_field_value(self, field: FieldInfo, field_name: str) -> tuple[Any, str, bool]:  # pragma: no cover
        return None, field_name, False

    def __call__(self) -> dict[str, Any]:
        fallbacks: dict[str, str] = getattr(self.settings_cls, "fallback_env", {})
        return {name: os.environ[var] for name, var in fallbacks.items() if os.environ.get(var)}


def service_config(service: str) -> SettingsConfigDict:
    """The model_config every service settings class uses (env prefix ``FLEETRL_<SERVICE>_``)."""
    return SettingsConfigDict(
        env_prefix=f"FLEETRL_{service.upper()}_",
        env_nested_delimiter="__",
        extra="forbid",
        validate_default=True,
    )


class FleetSettings(BaseSettings):
    """Base class: adds the config-file source and forbids unknown keys."""

    model_config = SettingsConfigDict(extra="forbid")

    @classmethod
    def settings_customise_sources(
        cls,
        settings_cls: type[BaseSettings],
        init_settings: PydanticBaseSettingsSource,
        env_settings: PydanticBaseSettingsSource,
        dotenv_settings: PydanticBaseSettingsSource,
        file_secret_settings: PydanticBaseSettingsSource,
    ) -> tuple[PydanticBaseSettingsSource, ...]:
        return (init_settings, env_settings, _ConfigFileSource(settings_cls), _FallbackEnvSource(settings_cls))


class ServiceSettings(FleetSettings):
    """Fields every service has."""

    fallback_env: ClassVar[dict[str, str]] = {"redis_url": "REDIS_URL"}

    host: str = Field(default="127.0.0.1", description="Bind address; loopback unless you mean to expose it.")
    port: int = Field(default=8000, ge=0, le=65535, description="HTTP port (0 picks a free one).")
    control_token: SecretStr | None = Field(
        default=None, description="Bearer token for control routes; without one, control routes are off."
    )
    run_key: SecretStr | None = Field(
        default=None,
        description="The run's signing key (at least 16 characters): every record this service writes to the queue "
                    "is signed with it (HMAC-SHA256) and every record it reads must carry a valid signature, else it "
                    "is dead-lettered. Every service of a run holds the same one (fleetrl run generates it; compose "
                    "and k8s read it from a secret). Unset: a service that shares Redis with queue records (the "
                    "rollout worker or sessions, an RL learner) refuses to start, unless allow_unsigned_records.",
    )
    allow_unsigned_records: bool = Field(
        default=False,
        description="Run without a run_key: queue records are neither signed nor checked, so anyone who can write "
                    "to this Redis can forge prompts and experiences. Only for a Redis no one else can write to.",
    )
    redis_url: str | None = Field(
        default=None,
        description="Redis URL (redis://[:password@]host:port/db, rediss:// for TLS); the password of an "
                    "authenticated server goes in the URL. Also taken from $REDIS_URL when no flag, "
                    "FLEETRL_<SERVICE>_ variable or file sets it. Unset: no Redis (the learner's entry point then "
                    "starts a private embedded server under its run_dir).",
    )
    run_name: str = Field(default="default", pattern=r"^[A-Za-z0-9_.-]+$", description="Namespace of Redis keys.")
    log_level: str = Field(default="INFO", description="Python logging level.")
    plugins: list[str] = Field(
        default_factory=list, description="Modules imported before the rest of these settings is read, so that the "
        "engines, scorers, algorithms ... they register can be configured here (docs/plugins.md), e.g. "
        "['mypkg.fleetrl_plugins']. Code runs only where the operator's settings name it.")
    sys_path: list[str] = Field(
        default_factory=list, description="Directories put first on sys.path before `plugins` are imported, so a "
        "module of yours that is not installed imports (fleetrl run passes its spec's `sys_path` here).")

    @field_validator("plugins")
    @classmethod
    def _plugins_imported(cls, v: list[str]) -> list[str]:
        """Validating never imports (nor touches sys.path): the load step has imported ``plugins`` already, and a
        settings object built otherwise that names modules not imported is refused, not half-configured."""
        import sys

        missing = [name for name in v if name not in sys.modules]
        if missing:
            raise ValueError(f"plugins {', '.join(map(repr, missing))} are not imported: build the settings with "
                             f"shared.settings.load_settings({cls.__name__}, ...), which imports them first")
        return v

    def unsigned_records_problem(self, shares_records: bool) -> str | None:
        """Why this service must not start (one line naming the settings), when it ``shares_records`` (reads or
        writes queue records on a Redis others use) with no ``run_key`` and no ``allow_unsigned_records``; else
        None."""
        if not shares_records or self.run_key is not None or self.allow_unsigned_records:
            return None
        return ("run_key is unset, and this service shares queue records on Redis (redis_url) that anyone who can "
                "write there could forge: give every service of the run the same run_key (openssl rand -hex 32), "
                "or set allow_unsigned_records: true to run without signing (docs/security-redis.md)")

    @field_validator("run_key")
    @classmethod
    def _run_key_long_enough(cls, v: SecretStr | None) -> SecretStr | None:
        if v is not None and len(v.get_secret_value()) < 16:
            raise ValueError("run_key must hold at least 16 characters; generate one with: openssl rand -hex 32")
        return v

    @field_validator("redis_url")
    @classmethod
    def _redis_url_scheme(cls, v: str | None) -> str | None:
        return redis_url_with_scheme(v)


def redis_url_with_scheme(v: str | None) -> str | None:
    """``v`` when it is a Redis URL redis-py reads (or None); else ValueError saying how to write one. Every place
    a user gives a Redis URL checks it so: a service's ``redis_url``, the run spec's ``redis.url``, the CLI's
    ``--redis-url``."""
    if v and not v.startswith(("redis://", "rediss://", "unix://")):
        from shared.redact import redact_url

        raise ValueError(f"{redact_url(v)!r} is not a Redis URL: use redis://[:password@]host:port/db, "
                         "rediss://... for TLS, or unix:///path/to/socket")
    return v


def format_validation_error(exc: ValidationError, source: str, cls: type[BaseSettings] | None = None) -> str:
    """One line per problem; an unknown key names the closest valid one of ``cls`` (``fleetrl settings
    <service>`` lists them all)."""
    from shared.settings_paths import closest_path, user_path

    lines = [f"invalid settings ({source}):"]
    for err in exc.errors():
        loc = ".".join(str(p) for p in err["loc"]) or "<root>"
        msg = str(err["msg"]).removeprefix("Value error, ")  # pydantic's prefix says nothing to a user
        if err["type"] == "extra_forbidden":
            near = closest_path(cls, user_path(cls, err["loc"])) if cls is not None else None
            msg = (f"unknown setting (did you mean {near}?)" if near else
                   "unknown setting (check the spelling; `fleetrl settings <service>` lists the valid keys)")
        lines.append(f"  {loc}: {msg}")
    return "\n".join(lines)


def _check_env_keys(cls: type[BaseSettings]) -> None:
    """pydantic-settings ignores unknown prefixed variables; a typo there must not pass silently."""
    prefix = (cls.model_config.get("env_prefix") or "").upper()
    if not prefix:
        return
    delim = cls.model_config.get("env_nested_delimiter") or "__"
    known = {name.upper() for name in cls.model_fields}
    for var in os.environ:
        if var.upper().startswith(prefix):
            field = var[len(prefix):].upper().split(delim, 1)[0]
            if field not in known:
                near = difflib.get_close_matches(field.lower(), sorted(k.lower() for k in known), n=1, cutoff=0.6)
                hint = f"did you mean {prefix}{near[0].upper()}?; " if near else ""
                raise SettingsError(
                    f"invalid settings (environment):\n  {var}: unknown setting {field.lower()!r} "
                    f"({hint}valid: {', '.join(sorted(k.lower() for k in known))})"
                )


def load_settings(cls: type[S], config_file: str | Path | None = None, **overrides: Any) -> S:
    """Build ``cls`` from overrides, environment, and ``config_file``. Raises SettingsError.

    The load step of every service's settings: when ``cls`` has ``plugins`` (a :class:`ServiceSettings`), it
    first reads only ``plugins`` and ``sys_path`` from the same sources, with the same precedence, puts
    ``sys_path`` first on ``sys.path`` and imports ``plugins``; then it builds the whole settings, which may name
    the kinds those modules registered. Validation itself never imports."""
    _check_env_keys(cls)
    overrides = {k: v for k, v in overrides.items() if v is not None}
    path = Path(config_file) if config_file is not None else None
    if path is not None and not path.is_file():
        raise SettingsError(f"config file {path} does not exist")
    # what the values came from: a service's flags (`fleetrl rollout --model X`) are overrides, not the environment
    source = str(path) if path else ("flags and environment" if overrides else "environment")
    token = _config_file.set(path)
    try:
        if "plugins" in cls.model_fields:
            _import_plugins_of(cls, overrides, source)
        return cls(**overrides)
    except ValidationError as exc:
        raise SettingsError(format_validation_error(exc, source, cls)) from exc
    finally:
        _config_file.reset(token)


def _import_plugins_of(cls: type[BaseSettings], overrides: dict[str, Any], source: str) -> None:
    """Import the ``plugins`` (``sys_path`` first) that ``cls`` built from ``overrides``, the environment and the
    config file (set by the caller) would hold. SettingsError naming the setting when one does not import."""
    from shared.plugins import import_plugins

    chosen = _plugin_fields(cls)(**{k: v for k, v in overrides.items() if k in ("plugins", "sys_path")})
    try:
        import_plugins(getattr(chosen, "plugins"), getattr(chosen, "sys_path"))  # noqa: B009 - fields made at run time
    except ValueError as exc:
        raise SettingsError(f"invalid settings ({source}):\n  plugins: {str(exc).removeprefix('plugins: ')}") from exc


_PLUGIN_FIELDS: dict[type, type[FleetSettings]] = {}


def _plugin_fields(cls: type[BaseSettings]) -> type[FleetSettings]:
    """A settings class of ``cls``'s ``plugins`` and ``sys_path`` alone, read from the same sources (its env
    prefix, the config file, overrides) and ignoring every other key."""
    found = _PLUGIN_FIELDS.get(cls)
    if found is None:
        config = SettingsConfigDict(**{k: v for k, v in cls.model_config.items()  # type: ignore[typeddict-item]
                                       if k in ("env_prefix", "env_nested_delimiter", "case_sensitive")},
                                    extra="ignore")
        found = _PLUGIN_FIELDS[cls] = type(f"{cls.__name__}Plugins", (FleetSettings,), {
            "__module__": __name__, "model_config": config,
            "__annotations__": {"plugins": list[str], "sys_path": list[str]},
            "plugins": cls.model_fields["plugins"], "sys_path": cls.model_fields["sys_path"]})
    return found
