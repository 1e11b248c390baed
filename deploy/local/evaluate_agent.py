"""Greedy held-out success of an agent: the run's own rollout function (e.g. ``multi_turn`` with the calculator
environment) run once per held-out prompt at temperature 0, against whatever policy a rollout service serves.

The rollout function is the very one the workers run, given a :class:`RolloutContext` whose generation goes
over the rollout service's HTTP API (``POST /generate`` with ``input_ids``: token-in / token-out, as the worker
drives its engine) and whose scoring is the reward service's ``/score``. A held-out episode succeeds when its
reward (the environment's, or the reward service's on the final answer) is >= ``eval.success_threshold``, as a
single-turn answer does; the mean reward is kept beside the success.
"""

from __future__ import annotations

import asyncio
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx

from deploy.local.evaluate import one_version
from services.rollout.engines.types import Finish, SamplingParams, SequenceOutput, SequenceRequest
from services.rollout.errors import RequestError
from services.rollout.reward_client import RewardClient
from services.rollout.trajectory import Trajectory
from services.rollout.worker.contract import GroupFailed, RolloutContext
from services.rollout.worker.functions import load_rollout_function
from shared.schemas import PromptTask


class HttpReplica:
    """A rollout service over its HTTP API, as the :class:`Replica` a :class:`RolloutContext` runs on."""

    sessions = None  # a held-out episode opens no session (openai_agent runs on the service's own)

    def __init__(self, url: str, client: httpx.AsyncClient, tokenizer: Any, info: dict[str, Any]) -> None:
        self.url = url.rstrip("/")
        self.client = client
        self.tokenizer = tokenizer
        self.model_name = str(info["served_model_name"])
        self.context_length = int(info["context_length"])
        self._tokenizing = ThreadPoolExecutor(1, thread_name_prefix="tokenizer")

    def encode(self, text: str) -> list[int]:
        return list(self.tokenizer.encode(text))

    async def off_loop(self, fn, *args):
        """``fn(*args)`` on this replica's one tokenizer thread (tokenizers are not thread-safe)."""
        return await asyncio.get_running_loop().run_in_executor(self._tokenizing, fn, *args)

    def close(self) -> None:
        self._tokenizing.shutdown(wait=False)

    def apply_chat_template(self, messages: list[dict]) -> list[int]:
        text = self.tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
        return list(self.tokenizer.encode(text, add_special_tokens=False))

    def check_sequence(self, ids, params: SamplingParams) -> int:
        room = self.context_length - len(ids)
        if room < 1:
            raise RequestError(f"prompt has {len(ids)} tokens; the context length is {self.context_length}")
        return min(params.max_new_tokens, room)  # the service bounds the rest (stops) when the request reaches it

    async def generate(self, seqs: list[SequenceRequest]) -> list[SequenceOutput]:
        return list(await asyncio.gather(*(self._one(s) for s in seqs)))

    async def _one(self, seq: SequenceRequest) -> SequenceOutput:
        p = seq.params
        r = await self.client.post(f"{self.url}/generate", json={
            "input_ids": list(seq.prompt_ids), "return_logprob": True,
            "sampling_params": {"max_new_tokens": p.max_new_tokens, "temperature": p.temperature, "top_p": p.top_p,
                                "top_k": p.top_k, "min_p": p.min_p, "stop": list(p.stop),
                                "stop_token_ids": list(p.stop_token_ids),
                                "skip_special_tokens": p.skip_special_tokens}})
        r.raise_for_status()
        out = r.json()
        meta = out["meta_info"]
        return SequenceOutput(rid=seq.rid, prompt_ids=seq.prompt_ids, output_ids=list(out["output_ids"]),
                              logprobs=[float(t[0]) for t in meta.get("output_token_logprobs") or []],
                              text=out["text"], finish=Finish(type=meta["finish_reason"]["type"]),
                              weight_version=int(meta["weight_version"]))


@dataclass(frozen=True)
class AgentEval:
    accuracy: float  # the share of episodes whose reward is >= the success threshold
    weight_version: str
    trajectories: list[Trajectory]
    tool_calls: int  # episodes with more than one turn (the model called a tool)
    mean_reward: float | None = None
    answers: tuple[dict, ...] = ()  # per episode, as ``fleetrl eval --show`` prints it and samples.jsonl keeps it


def summarize(trajectories: list[Trajectory], rows: list[dict], tokenizer: Any, success_threshold: float = 1.0,
              weight_version: str = "") -> AgentEval:
    """Held-out episodes in figures: success (reward >= ``success_threshold``), mean reward, the episodes that
    called a tool, and one answer per episode (the prompt, the whole response with the environment's turns, the
    label, the reward, the model's tokens and turns, whether it called a tool or hit max_new_tokens)."""
    answers = []
    for t, row in zip(trajectories, rows):
        model_turns = [x for x in t.turns if x.kind == "model"]
        answers.append({"prompt": row.get("prompt", row.get("input")),
                        "completion": tokenizer.decode(list(t.response_ids), skip_special_tokens=True),
                        "label": row.get("label"), "reward": t.reward,
                        "tokens": sum(len(x.ids) for x in model_turns) if t.turns else len(t.response_ids),
                        "model_turns": len(model_turns) or 1, "called_tool": len(t.turns) > 1,
                        "hit_max_new_tokens": t.finish_reason == "length"})
    n = len(trajectories)
    return AgentEval(accuracy=sum(t.reward >= success_threshold for t in trajectories) / n if n else 0.0,
                     weight_version=weight_version, trajectories=trajectories,
                     tool_calls=sum(1 for t in trajectories if len(t.turns) > 1),
                     mean_reward=sum(t.reward for t in trajectories) / n if n else None, answers=tuple(answers))


def greedy_success(rollout_url: str, reward_url: str, rows: list[dict], worker: Any, *, max_new_tokens: int,
                   samples: tuple[Path, str] | None = None, concurrency: int = 64,
                   timeout: float = 300.0, mixed_ok: bool = False, success_threshold: float = 1.0) -> AgentEval:
    """Run ``worker.rollout_function`` greedily once per row (``input`` as the prompt, ``label``); ``worker`` is
    the rollout service's ``WorkerSettings`` (its agent settings, stop tokens). ``samples``: (path, title) of a
    markdown file for the first few episodes. Raises RuntimeError when the answers came from several weight
    versions (unless ``mixed_ok``: see :func:`~deploy.local.evaluate.one_version`) or an episode could not be
    run (with the reason). An episode succeeds when its reward is >= ``success_threshold``
    (``eval.success_threshold``)."""
    return asyncio.run(_greedy_success(rollout_url, reward_url, rows, worker, max_new_tokens, samples,
                                       concurrency, timeout, mixed_ok, success_threshold))


async def _greedy_success(rollout_url, reward_url, rows, worker, max_new_tokens, samples, concurrency,
                          timeout, mixed_ok, success_threshold) -> AgentEval:
    from transformers import AutoTokenizer  # only when evaluating

    fn = load_rollout_function(worker.rollout_function)
    params = SamplingParams(max_new_tokens=max_new_tokens, temperature=0.0, stop=tuple(worker.sampling.stop),
                            stop_token_ids=tuple(worker.sampling.stop_token_ids))
    token = worker.reward_token.get_secret_value() if worker.reward_token else None  # as the run's workers send
    rewards = RewardClient(reward_url, timeout_s=timeout, backoff_max_s=2.0, token=token)
    gate = asyncio.Semaphore(concurrency)
    async with httpx.AsyncClient(timeout=timeout, limits=httpx.Limits(max_connections=concurrency)) as client:
        info = (await client.get(f"{rollout_url.rstrip('/')}/model_info")).raise_for_status().json()
        tokenizer = await asyncio.to_thread(AutoTokenizer.from_pretrained, info["tokenizer_path"])
        replica = HttpReplica(rollout_url, client, tokenizer, info)

        async def one(i: int, row: dict) -> Trajectory:
            task = PromptTask(id=f"heldout-{i}", prompt=row.get("prompt", row["input"]), label=row.get("label"), n=1,
                              metadata=dict(row.get("metadata") or {}))
            async with gate:
                try:
                    (t,) = await fn(RolloutContext(task, params, worker, replica, rewards))
                except GroupFailed as exc:
                    raise RuntimeError(f"held-out prompt {i}: {exc}") from exc
            return t

        try:
            trajectories = list(await asyncio.gather(*(one(i, r) for i, r in enumerate(rows))))
        finally:
            await rewards.aclose()
            replica.close()
    version = one_version({str(v) for t in trajectories for _, v in t.version_spans}, mixed_ok)
    if samples is not None:
        write_samples(samples[0], trajectories, tokenizer, samples[1])
    return summarize(trajectories, rows, tokenizer, success_threshold, version)


def render_markdown(trajectories: list[Trajectory], tokenizer: Any, title: str, limit: int = 6) -> str:
    """A few trajectories turn by turn: the prompt, the model's turns (tool calls as written), the environment's
    turns (tool results, as the template wrote them), the reward."""
    lines = [f"# {title}", ""]
    for n, t in enumerate(trajectories[:limit]):
        turns = sum(1 for x in t.turns if x.kind == "model")
        lines += [f"## sample {n}: reward {t.reward:g}, finish {t.finish_reason}, {turns} model turns", "",
                  "prompt:", "", "```", tokenizer.decode(list(t.prompt_ids), skip_special_tokens=False), "```"]
        for turn in t.turns:
            who = "model (trained on, mask 1)" if turn.kind == "model" else "environment (mask 0)"
            lines += [f"{who}:", "", "```", tokenizer.decode(list(turn.ids), skip_special_tokens=False), "```"]
        lines.append("")
    return "\n".join(lines)


def write_samples(path: Path, trajectories: list[Trajectory], tokenizer: Any, title: str) -> Path:
    path.write_text(render_markdown(trajectories, tokenizer, title))
    return path
