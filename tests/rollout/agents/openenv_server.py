"""A plain OpenEnv environment server (openenv-core's own ``create_app``, nothing FleetRL in it), run as its own
process by the tests: "say the word". Each episode (WebSocket session) picks a word; the observation asks for
it; a step whose message contains it ends the episode with reward 1, otherwise the observation says what was
heard, and after 3 misses the episode ends with reward 0.

    python -m tests.rollout.agents.openenv_server --port 8123
"""

from __future__ import annotations

import argparse
from uuid import uuid4

import uvicorn
from openenv.core.env_server.http_server import create_app
from openenv.core.env_server.interfaces import Environment
from openenv.core.env_server.types import Action, Observation, State
from pydantic import Field


class SayAction(Action):
    message: str = Field(..., description="What the agent says")


class SayObservation(Observation):
    prompt: str = Field(default="", description="What the environment says")
    attempts: int = Field(default=0)


class SayTheWord(Environment):
    SUPPORTS_CONCURRENT_SESSIONS = True

    def __init__(self) -> None:
        self._state = State(episode_id=str(uuid4()), step_count=0)
        self.word = "a"

    def reset(self, seed: int | None = None) -> SayObservation:
        self._state = State(episode_id=str(uuid4()), step_count=0)
        self.word = "abcdefghij"[(seed or 0) % 10]
        return SayObservation(prompt=f"Say the letter {self.word}.", done=False, reward=None)

    def step(self, action: SayAction) -> SayObservation:  # type: ignore[override]
        self._state.step_count += 1
        if self.word in action.message:
            return SayObservation(prompt="correct", attempts=self._state.step_count, done=True, reward=1.0)
        done = self._state.step_count >= 3
        return SayObservation(prompt=f"I heard {action.message[:20]!r}; say {self.word}.",
                              attempts=self._state.step_count, done=done, reward=0.0 if done else None)

    @property
    def state(self) -> State:
        return self._state


app = create_app(SayTheWord, SayAction, SayObservation, env_name="say_the_word", max_concurrent_envs=16)

if __name__ == "__main__":
    parser = argparse.ArgumentParser()
    parser.add_argument("--port", type=int, required=True)
    uvicorn.run(app, host="127.0.0.1", port=parser.parse_args().port, log_level="warning")
