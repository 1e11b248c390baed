"""A verifiers v1 environment with a tool (``vf_env/fleetrl_vf_calc.py``: a taskset, a ``vf.Toolset`` MCP
server with ``add``, a ``@vf.reward``; verifiers 0.4's successor of ``ToolEnv``) rolled out by verifiers' own
code, unmodified, against a real rollout service process: ``SingleAgentEnv.run_episode`` with the ``null``
harness (verifiers' own chat program with MCP tools, in a subprocess), verifiers' interception server, and
its ``TrainClient`` rendering each turn to ids and calling ``/inference/v1/generate`` with
``X-Session-ID: <trace id>``. The orchestrator's part (what prime-rl does around verifiers) is the test's:
open a FleetRL session named after the trace when verifiers mints it, and finish it with verifiers' reward.

The model must call the tool, which a random tiny model never does, so the test trains one first: the tiny
byte-level Llama with ``<tool_call>``/``</tool_call>`` tokens, ``<|im_end|>`` as EOS and a Hermes-style chat
template that renders an assistant's ``tool_calls`` back as ``<tool_call>{json}</tool_call>``, fitted for a
few seconds to answer the task's two turns (call ``calc_add``, then state the sum); sampling is greedy.

Stitching: verifiers' ``TrainClient`` bridges turns with the renderer's ``bridge_to_next_turn``; the
``DefaultRenderer`` (the only one for a model outside the renderers' model map) never bridges and re-renders
the whole conversation with the chat template. That re-render extends the previous prompt + completion
exactly only because this template renders the parsed tool call back to the very bytes the model wrote
(``qwen3`` tool parser, ``json.dumps`` spacing) and the byte-level tokenizer re-tokenises text exactly; the
session then stitches both turns into one trajectory. (With the stock tiny template, which has no
``tool_calls``, the re-render drops the call and the session starts a second trajectory: what FleetRL does
with any client whose history does not extend, tested in test_sessions_openai.py.)

verifiers runs its chat program through ``uv`` from PyPI (``Runtime.prepare_uv_script``); its dependencies
(openai, mcp 2.0.0, httpx, httpx2, tenacity, certifi) are the project's dev install, so the test registers
this interpreter for the script instead of letting uv build an environment over the network.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import os
import sys
from pathlib import Path

import httpx
import pytest

from tests.procs import starts_processes, stop
from tests.rollout.conftest import start_rollout
from tests.rollout.routes.conftest import AUTH, session_config
from tests.rollout.routes.test_sessions_openai import finish, pushed

vf = pytest.importorskip("verifiers.v1")
renderers_configs = pytest.importorskip("renderers.configs")

ENV_DIR = Path(__file__).parent / "vf_env"
REPO = Path(__file__).resolve().parents[3]
TOOL = "calc_add"
CALL = f'<tool_call>{{"name": "{TOOL}", "arguments": {{"a": 2, "b": 3}}}}</tool_call>'
ANSWER = "The answer is 5."
TEMPLATE = (
    "{% for message in messages %}<|im_start|>{{ message['role'] }}\n"
    "{% if message['content'] %}{{ message['content'] }}{% endif %}"
    "{% for call in message['tool_calls'] or [] %}<tool_call>{\"name\": \"{{ call['function']['name'] }}\", "
    "\"arguments\": {% if call['function']['arguments'] is string %}{{ call['function']['arguments'] }}"
    "{% else %}{{ call['function']['arguments'] | tojson }}{% endif %}}</tool_call>{% endfor %}"
    "<|im_end|>\n{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)


def build_tool_model(out: Path) -> Path:
    """The tiny Llama with tool-call tokens and template, fitted to call ``calc_add`` and then answer."""
    import torch
    from transformers import AutoModelForCausalLM, GenerationConfig

    from deploy.local import tiny_model

    torch.set_num_threads(1)
    tok = tiny_model.build_tokenizer()
    tok.add_special_tokens({"additional_special_tokens": ["<tool_call>", "</tool_call>"]})
    tok.eos_token = "<|im_end|>"
    tok.chat_template = TEMPLATE
    config = tiny_model._llama_config(tok, hidden_size=64, layers=2, heads=4, max_positions=512)
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    model.generation_config = GenerationConfig(bos_token_id=tok.bos_token_id, eos_token_id=tok.eos_token_id,
                                               pad_token_id=tok.pad_token_id)
    user = [{"role": "user", "content": "What is 2+3?"}]
    called = {"role": "assistant", "content": None, "tool_calls": [
        {"id": "c", "type": "function", "function": {"name": TOOL, "arguments": '{"a": 2, "b": 3}'}}]}
    script = [(user, CALL), (user + [called, {"role": "tool", "tool_call_id": "c", "content": "5"}], ANSWER)]
    rows = []
    for messages, reply in script:
        prompt = tok.encode(tok.apply_chat_template(messages, add_generation_prompt=True, tokenize=False),
                            add_special_tokens=False)
        rows.append((prompt, tok.encode(reply, add_special_tokens=False) + [tok.eos_token_id]))
    width = max(len(p) + len(r) for p, r in rows)
    ids = torch.tensor([p + r + [tok.pad_token_id] * (width - len(p) - len(r)) for p, r in rows])
    labels = torch.tensor([[-100] * len(p) + r + [-100] * (width - len(p) - len(r)) for p, r in rows])
    attn = (labels != -100) | torch.tensor([[1] * len(p) + [0] * (width - len(p)) for p, _ in rows]).bool()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
    for _ in range(400):
        loss = model(input_ids=ids, attention_mask=attn.long(), labels=labels).loss
        loss.backward()
        opt.step()
        opt.zero_grad()
        if loss.item() < 2e-3:
            break
    model.eval()
    with torch.no_grad():
        for prompt, reply in rows:
            out_ids = model.generate(torch.tensor([prompt]), max_new_tokens=len(reply), do_sample=False)
            assert out_ids[0, len(prompt):].tolist() == reply, "the tiny tool model did not learn its two turns"
    model.save_pretrained(out, safe_serialization=True)
    tiny_model.save_tokenizer(tok, out)
    cfg = json.loads((out / "tokenizer_config.json").read_text())
    cfg["chat_template"] = TEMPLATE
    (out / "tokenizer_config.json").write_text(json.dumps(cfg, indent=2))
    return out


@pytest.fixture(scope="module")
@starts_processes
def tool_rollout(redis_server, tmp_path_factory):
    tmp = tmp_path_factory.mktemp("vf-tool-env")
    model_dir = build_tool_model(tmp / "model")
    proc, url, _log = start_rollout(tmp, "rollout", session_config(model_dir, redis_server.url))
    yield url, model_dir
    stop(proc)


@pytest.fixture()
def vf_env_path(monkeypatch):
    """verifiers imports the taskset by module name and starts its toolset as ``python -m``; the chat program
    runs on this interpreter (see the module docstring)."""
    from verifiers.v1.harnesses.utils.launch import CHAT_PROGRAM_SOURCE
    from verifiers.v1.runtimes.subprocess import SubprocessRuntime

    monkeypatch.syspath_prepend(str(ENV_DIR))
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join([str(ENV_DIR), str(REPO), os.environ.get("PYTHONPATH", "")]))
    script = Path(SubprocessRuntime.scripts_dir) / f"{hashlib.sha256(CHAT_PROGRAM_SOURCE.encode()).hexdigest()}.py"
    script.parent.mkdir(parents=True, exist_ok=True)
    script.write_text(CHAT_PROGRAM_SOURCE)
    monkeypatch.setitem(SubprocessRuntime._interpreters, str(script), sys.executable)


async def _episode(url: str, model_dir: Path, prompt_id: str):
    opened: list[str] = []

    def open_session(trace) -> None:  # the orchestrator's part: one FleetRL session per verifiers trace
        r = httpx.post(f"{url}/sessions", json={"session_id": trace.id, "prompt_id": prompt_id}, headers=AUTH,
                       timeout=30)
        assert r.status_code == 201, r.text
        opened.append(trace.id)

    env = vf.SingleAgentEnv(vf.SingleAgentEnvConfig(taskset={"id": "fleetrl_vf_calc"},
                                                    agent={"harness": {"id": "null"},
                                                           "runtime": {"type": "subprocess"}}))
    client = vf.TrainClientConfig(base_url=f"{url}/v1", renderer_model_name=str(model_dir), headers=AUTH,
                                  renderer=renderers_configs.DefaultRendererConfig(tool_parser="qwen3"))
    ctx = vf.ModelContext(model="tiny", client=client, sampling=vf.SamplingConfig(max_tokens=80, temperature=0.0))
    task = next(iter(env.taskset))
    async with env.serving():
        episode = await env.run_episode(task, ctx, on_trace=open_session)
    return episode, opened


def _runs(mask: list[int], ids: list[int], value: int) -> list[list[int]]:
    """The maximal runs of ``ids`` whose mask is ``value``, in order."""
    runs: list[list[int]] = []
    for i, (m, t) in enumerate(zip(mask, ids)):
        if m == value:
            if i == 0 or mask[i - 1] != value:
                runs.append([])
            runs[-1].append(t)
    return runs


def test_verifiers_tool_env_episode_is_one_exact_trajectory(tool_rollout, redis_server, vf_env_path):
    from transformers import AutoTokenizer

    url, model_dir = tool_rollout
    episode, opened = asyncio.run(_episode(url, model_dir, "vf-calc-1"))
    assert episode.ok, episode.errors
    (trace,) = episode.traces
    assert opened == [trace.id]
    # verifiers' own rollout: the model called the MCP tool, read its result, answered; its reward scored that
    roles = [m.role for m in trace.messages]
    assert roles == ["user", "assistant", "tool", "assistant"], trace.messages
    assert trace.messages[1].tool_calls[0].name == TOOL and trace.messages[2].content == "5"
    assert trace.last_reply == ANSWER and trace.reward == 1.0

    done = finish(url, trace.id, reward=trace.reward, reward_components={k: r.value for k, r in trace.rewards.items()})
    exps = {k: v for k, v in pushed(redis_server.url).items() if v.prompt_id == "vf-calc-1"}
    assert list(exps) == ["vf-calc-1#0"] == done["experience_ids"], exps  # one trajectory: both turns stitched
    exp = exps["vf-calc-1#0"]
    assert exp.reward == trace.reward and exp.reward_components == {"correct": 1.0}
    prompt, response = list(exp.prompt_token_ids), list(exp.response_token_ids)
    mask = list(exp.action_mask)
    assert len(mask) == len(response) == len(exp.response_logprobs)

    # token fidelity: what FleetRL recorded is verifiers' own training sample, token for token ...
    (branch,) = trace.branches
    assert prompt + response == branch.token_ids
    assert [0] * len(prompt) + mask == [int(m) for m in branch.sampled_mask]
    # ... each model turn is the ids the engine returned for that call (verifiers' record of each
    # /inference/v1/generate), the mask 1 on them alone, with their engine logprobs ...
    engine_turns = [[t for t, m in zip(n.token_ids, n.mask) if m] for n in branch.nodes if any(n.mask)]
    assert _runs(mask, response, 1) == engine_turns and len(engine_turns) == 2
    tok = AutoTokenizer.from_pretrained(model_dir)
    assert tok.decode(engine_turns[0]) == CALL + "<|im_end|>"
    assert tok.decode(engine_turns[1]) == ANSWER + "<|im_end|>"
    sampled = [lp for lp, m in zip(exp.response_logprobs, mask) if m]
    assert sampled == pytest.approx([lp for lp, m in zip(branch.logprobs, branch.sampled_mask) if m], abs=1e-5)
    assert all(lp == 0.0 for lp, m in zip(exp.response_logprobs, mask) if not m)
    # ... and the one environment turn between them (mask 0) is the chat template's delta for the tool message
    (env_turn,) = _runs(mask, response, 0)
    assert tok.decode(env_turn) == "\n<|im_start|>tool\n5<|im_end|>\n<|im_start|>assistant\n"
    wire = [{"role": "user", "content": "What is 2+3?"},
            {"role": "assistant", "content": None, "tool_calls": [{"id": "c", "type": "function", "function": {
                "name": TOOL, "arguments": trace.messages[1].tool_calls[0].arguments}}]},
            {"role": "tool", "tool_call_id": "c", "content": "5"}]
    second_prompt = tok.encode(tok.apply_chat_template(wire, add_generation_prompt=True, tokenize=False),
                               add_special_tokens=False)
    assert second_prompt == prompt + engine_turns[0] + env_turn
