"""``openenv``: an OpenEnv environment server (``openenv-core``), unmodified, as a multi-turn environment.

OpenEnv servers keep an episode per WebSocket session (``/ws``: reset, step, close); this adapter drives one
through OpenEnv's own ``GenericEnvClient`` (plain dicts, no environment package needed here), with a connect
and a per-message timeout. Each observation becomes a ``user`` message (``observation_field`` of it, or the
whole observation as JSON); each assistant message becomes the action ``{action_field: content}`` (plus the
task's ``metadata.openenv_action`` fields). The server's ``reward`` and ``done`` are the episode's: the
reward of the step that ends it is the trajectory's (None: the reward service scores it).

Arguments (``worker.agent.environment_args`` or a task's ``metadata.environment_args``): ``base_url``,
``action_field`` ("message"), ``observation_field`` (None: all of it), ``reset_args`` ({}: e.g. a seed),
``connect_timeout_s``, ``message_timeout_s``. Needs the ``agents`` extra (``openenv-core``).
"""

from __future__ import annotations

import json
from typing import Any

from services.rollout.agents.environments import BadEnvironmentOutput, EnvReply, EnvStart
from shared.schemas import PromptTask

_NOT_SHOWN = frozenset({"done", "reward", "metadata"})


class OpenEnvEnvironment:
    def __init__(self, base_url: str, action_field: str = "message", observation_field: str | None = None,
                 reset_args: dict[str, Any] | None = None, connect_timeout_s: float = 10.0,
                 message_timeout_s: float = 30.0) -> None:
        from openenv.core.generic_client import GenericEnvClient

        self.client = GenericEnvClient(base_url=base_url, connect_timeout_s=connect_timeout_s,
                                       message_timeout_s=message_timeout_s)
        self.action_field, self.observation_field = action_field, observation_field
        self.reset_args = dict(reset_args or {})
        self.extra_action: dict[str, Any] = {}

    def render(self, observation: Any) -> str:
        if not isinstance(observation, dict):
            raise BadEnvironmentOutput(f"the OpenEnv server sent an observation that is a {type(observation).__name__}, "
                             "not an object")
        if self.observation_field is not None:
            if self.observation_field not in observation:
                raise BadEnvironmentOutput(f"the observation has no field {self.observation_field!r} (fields: "
                                 f"{sorted(observation)})")
            value = observation[self.observation_field]
            return value if isinstance(value, str) else json.dumps(value, ensure_ascii=False)
        return json.dumps({k: v for k, v in observation.items() if k not in _NOT_SHOWN}, ensure_ascii=False)

    async def reset(self, task: PromptTask) -> EnvStart:
        self.extra_action = dict(task.metadata.get("openenv_action", {}))
        await self.client.connect()
        result = await self.client.reset(**self.reset_args)
        first = ([m.model_dump() for m in task.prompt] if isinstance(task.prompt, list)
                 else [{"role": "system", "content": task.prompt}] if task.prompt else [])
        return EnvStart(messages=[*first, {"role": "user", "content": self.render(result.observation)}])

    async def step(self, message: dict[str, Any]) -> EnvReply:
        result = await self.client.step({**self.extra_action, self.action_field: message.get("content") or ""})
        reward = float(result.reward) if result.reward is not None else None
        if result.done:
            return EnvReply(done=True, reward=reward)
        return EnvReply(messages=[{"role": "user", "content": self.render(result.observation)}], reward=reward)

    async def close(self) -> None:
        await self.client.close()
