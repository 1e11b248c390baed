"""Token fidelity of multi-turn trajectories, end to end: the real rollout worker (the tiny model's hf engine, a
real Redis, the reward service as its own process) runs the multi_turn rollout function; the experiences the
learner reads hold, turn by turn, exactly the ids the engine produced and the chat template's delta for each
environment message, with the mask on the model's tokens only; and the learner's logprobs of those tokens
(services/learner/training/batch.py) match the engine's."""

from __future__ import annotations

import asyncio
import time

import pytest
import torch
from transformers import AutoModelForCausalLM

from services.learner.training.batch import action_logprobs, build_rl_batch
from services.rollout.chat_tokens import ChatTokens
from services.rollout.service import RolloutService
from services.rollout.settings import RolloutSettings
from shared import keys
from shared.experience_queue import StreamQueue
from shared.ports import free_port
from shared.schemas import Experience, PromptTask, sample_id
from tests.procs import stop
from tests.rollout.test_worker import start_reward

TURNS = 3
REPLY = "go on"


@pytest.mark.process
async def test_learner_trains_on_the_engines_ids_and_the_templates_deltas(redis_server, redis_client, tiny_model_dir,
                                                                          tmp_path):
    run = "fidelity"
    reward_port = free_port()
    reward = start_reward(tmp_path, reward_port)
    settings = RolloutSettings(
        model=str(tiny_model_dir), redis_url=redis_server.url, run_name=run, weight_sidecar=False,
        engine={"kind": "hf", "device": "cpu", "torch_threads": 1, "max_wait_ms": 2},
        worker={"enabled": True, "reward_url": f"http://127.0.0.1:{reward_port}", "poll_interval_s": 0.1,
                "rollout_function": "multi_turn", "sampling": {"max_new_tokens": 10, "temperature": 1.0},
                "agent": {"environment": "echo", "environment_args": {"turns": TURNS, "reply": REPLY}}})
    svc = RolloutService(settings)
    calls: list[tuple[tuple[int, ...], list[int], list[float], int]] = []  # (prompt ids, output ids, logprobs, version)
    generate = svc.generate

    async def recording(seqs):
        outs = await generate(seqs)
        calls.extend((s.prompt_ids, list(o.output_ids), list(o.logprobs), o.weight_version) for s, o in zip(seqs, outs))
        return outs

    svc.generate = recording  # record what the engine produced, on the real path
    await svc.start()
    try:
        task = PromptTask(id="chat", prompt=[{"role": "user", "content": "hello there"}], n=4, label="a")
        await StreamQueue(redis_client, keys.prompts_stream(run), "rollout", PromptTask).produce(task)
        learner = StreamQueue(redis_client, keys.experiences_stream(run), "learner", Experience)
        await learner.ensure_group()
        exps: list[Experience] = []
        deadline = time.monotonic() + 90
        while len(exps) < task.n and time.monotonic() < deadline:
            exps += [d.record for d in await learner.consume("learner", count=10, block_ms=200)]
        assert sorted(e.id for e in exps) == [sample_id("chat", i) for i in range(task.n)]
        chat = ChatTokens(svc.tokenizer)
        env_delta = chat.delta([{"role": "user", "content": REPLY}])
        unused = list(calls)
        model_tokens = 0
        for e in exps:
            prompt, response = list(e.prompt_token_ids), list(e.response_token_ids)
            assert prompt == chat.prompt([{"role": "user", "content": "hello there"}])
            mask, lps = list(e.action_mask), list(e.response_logprobs)
            pos, turns = 0, 0
            while pos < len(response):  # walk the trajectory turn by turn
                context = tuple(prompt + response[:pos])  # the engine was asked to continue exactly this ...
                match = [c for c in unused if c[0] == context and response[pos:pos + len(c[1])] == c[1]]
                assert match, f"no engine call continued turn {turns} with these ids"  # ... and sampled these
                unused.remove(match[0])
                _, out_ids, out_lps, _ = match[0]
                assert mask[pos:pos + len(out_ids)] == [1] * len(out_ids)
                assert lps[pos:pos + len(out_ids)] == out_lps
                turns += 1
                model_tokens += len(out_ids)
                pos += len(out_ids)
                if pos == len(response):
                    break
                env_ids = chat.close_turn(out_ids) + env_delta  # the turn's end, then the template's delta
                assert response[pos:pos + len(env_ids)] == env_ids
                assert mask[pos:pos + len(env_ids)] == [0] * len(env_ids)
                assert lps[pos:pos + len(env_ids)] == [0.0] * len(env_ids)
                pos += len(env_ids)
            assert turns == TURNS and e.finish_reason == "stop" and e.metadata["turns"] == TURNS
            assert e.reward == (1.0 if "a" in svc.tokenizer.decode(out_ids, skip_special_tokens=True) else 0.0)
            assert e.version_spans == [(0, 0)] and e.sampling.temperature == 1.0 and e.sampling.max_tokens == 10

        # the learner's logprobs of the model's tokens match the engine's
        model = AutoModelForCausalLM.from_pretrained(str(tiny_model_dir), dtype=torch.float32).eval()
        batch = build_rl_batch(exps, pad_id=svc.tokenizer.pad_token_id)
        with torch.no_grad():
            learner_lp, _ = action_logprobs(model, batch, batch.temperatures)
        on = batch.action_mask.bool()
        assert unused == []  # every engine call is in a trajectory, once
        assert int(on.sum()) == model_tokens  # environment tokens are not actions
        assert torch.allclose(learner_lp[on], batch.engine_logprobs[on], atol=2e-3), \
            (learner_lp[on] - batch.engine_logprobs[on]).abs().max()
        assert bool((learner_lp[~on] == 0).all())
    finally:
        await svc.stop()
        await asyncio.to_thread(stop, reward)
