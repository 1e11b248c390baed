"""The wire models take what the upstream clients send: SGLang 0.5.x's whole ``SamplingParams`` /
``GenerateReqInput`` (``null`` = the default), OpenAI's and vLLM's documented extras; fields no upstream API
defines are still refused naming them; an upstream-only field set to a real value is kept aside for the service
to refuse naming its engine (tests/rollout/test_upstream_fields_http.py)."""

from __future__ import annotations

import ast
import importlib.util
from pathlib import Path

import pytest
from pydantic import ValidationError

from shared.generate_api import ChatCompletionRequest, CompletionRequest, GenerateRequest, SamplingParamsIn
from shared.inference_api import TokenGenerateRequest
from shared.upstream_fields import SGLANG_GENERATE, SGLANG_SAMPLING

# What SGLang 0.5.23's frontend sends for `sgl.gen("answer", max_tokens=4, temperature=0)` (RuntimeEndpoint.generate:
# its global_config's two decode flags, then SglSamplingParams.to_srt_kwargs()); main refused it with
# "sampling_params.spaces_between_special_tokens: unknown field (not part of this API); ..." (issue 37).
SGLANG_FRONTEND_BODY = {
    "text": "Q: 1+1?\nA:",
    "sampling_params": {
        "skip_special_tokens": True, "spaces_between_special_tokens": True, "max_new_tokens": 4, "min_new_tokens": 0,
        "n": 1, "stop": [], "stop_token_ids": [], "stop_regex": [], "temperature": 0, "top_p": 1.0, "top_k": -1,
        "min_p": 0.0, "frequency_penalty": 0.0, "presence_penalty": 0.0, "ignore_eos": False, "regex": None,
        "json_schema": None,
    },
}


def test_sglang_frontend_request_is_accepted():
    req = GenerateRequest.model_validate(SGLANG_FRONTEND_BODY)
    sp = req.sampling_params
    assert (sp.max_new_tokens, sp.temperature, sp.grammar(), sp.stop_regex_list()) == (4, 0.0, None, [])
    assert req.unhonoured() == {}


def test_null_means_the_default():
    sp = SamplingParamsIn.model_validate({k: None for k in SamplingParamsIn.model_fields if k != "max_new_tokens"})
    assert sp == SamplingParamsIn()
    assert SamplingParamsIn.model_validate({"max_new_tokens": None}).max_new_tokens is None  # SGLang: the context
    req = GenerateRequest.model_validate({"text": "x", "return_logprob": None, "logprob_start_len": None,
                                          "top_logprobs_num": None, "stream": None, "rid": None})
    assert (req.return_logprob, req.logprob_start_len, req.top_logprobs_num, req.stream) == (False, -1, 0, False)
    chat = ChatCompletionRequest.model_validate({"messages": [{"role": "user", "content": "x"}], "temperature": None,
                                                 "n": None, "logprobs": None, "max_tokens": None})
    assert (chat.temperature, chat.n, chat.logprobs, chat.max_tokens) == (1.0, 1, False, None)


def test_every_sglang_field_at_its_default_is_accepted():
    sp = {name: (None if neutral is not False and neutral != 0 else neutral) for name, neutral in SGLANG_SAMPLING.items()}
    body = {name: None for name in SGLANG_GENERATE}
    req = GenerateRequest.model_validate({**body, "text": "x", "sampling_params": sp})
    assert req.unhonoured() == {}


def test_upstream_fields_set_for_real_are_kept_aside_with_their_path():
    req = GenerateRequest.model_validate({"text": "x", "lora_path": "adapter-1", "routing_key": "anything",
                                          "sampling_params": {"logit_bias": {"5": 2.0}, "stream_interval": 4}})
    # routing_key and stream_interval are informational: any value is fine
    assert req.unhonoured() == {"lora_path": "adapter-1", "sampling_params.logit_bias": {"5": 2.0}}
    cmpl = CompletionRequest.model_validate({"prompt": "x", "use_beam_search": True, "metadata": {"a": "b"}})
    assert cmpl.unhonoured() == {"use_beam_search": True}


@pytest.mark.parametrize("model, body, field", [
    (GenerateRequest, {"text": "x", "sampling_params": {"bogus": 1}}, "sampling_params.bogus"),
    (GenerateRequest, {"text": "x", "not_sglang": None}, "not_sglang"),
    (CompletionRequest, {"prompt": "x", "not_openai": 1}, "not_openai"),
    (ChatCompletionRequest, {"messages": [{"role": "user", "content": "x"}], "nope": True}, "nope"),
])
def test_fields_no_upstream_api_defines_are_refused_naming_them(model, body, field):
    with pytest.raises(ValidationError) as err:
        model.model_validate(body)
    assert any(".".join(map(str, e["loc"])) == field and e["type"] == "extra_forbidden" for e in err.value.errors())


@pytest.mark.parametrize("sp, says", [
    ({"min_new_tokens": 5, "max_new_tokens": 2}, "min_new_tokens=5 is over max_new_tokens=2"),
    ({"regex": "a+", "json_schema": "{}"}, "at most one of"),
    ({"stop_regex": "("}, "not a valid regular expression"),
    ({"repetition_penalty": 0}, "repetition_penalty"),
    ({"frequency_penalty": 3}, "frequency_penalty"),
])
def test_bad_values_are_refused_naming_the_field(sp, says):
    with pytest.raises(ValidationError, match=says):
        SamplingParamsIn.model_validate(sp)


def test_vllm_structured_outputs_read_as_grammars():
    def grammar(so):
        return TokenGenerateRequest.model_validate(
            {"token_ids": [1], "sampling_params": {"structured_outputs": so}}).sampling_params.grammar()

    assert grammar({"regex": "a+"}) == ("regex", "a+")
    assert grammar({"json": {"type": "object"}}) == ("json_schema", '{"type": "object"}')
    assert grammar({"grammar": "root ::= \"a\"", "disable_fallback": True}) == ("ebnf", "root ::= \"a\"")
    assert grammar({"json_object": True}) == ("json_object", "")
    with pytest.raises(ValidationError, match="structured_outputs.choice"):
        grammar({"choice": ["a", "b"]})


def _sglang_source(module: str) -> Path:
    spec = importlib.util.find_spec("sglang")
    assert spec is not None and spec.origin, "sglang (the pinned frontend, `make install`) is not installed"
    return Path(spec.origin).parent.joinpath(*module.split("/"))


def _fields(path: Path, cls: str) -> list[str]:
    tree = ast.parse(path.read_text())
    node = next(n for n in tree.body if isinstance(n, ast.ClassDef) and n.name == cls)
    return [n.target.id for n in node.body if isinstance(n, ast.AnnAssign) and isinstance(n.target, ast.Name)]


@pytest.mark.parametrize("module, cls, model, table", [
    ("srt/sampling/sampling_params.py", "SamplingParams", SamplingParamsIn, SGLANG_SAMPLING),
    ("srt/managers/io_struct.py", "GenerateReqInput", GenerateRequest, SGLANG_GENERATE),
])
def test_every_field_of_the_pinned_sglang_is_known(module, cls, model, table):
    """Read from the installed sglang's own source: a field a new SGLang adds fails here, not in a user's run."""
    theirs = set(_fields(_sglang_source(module), cls))
    ours = set(model.model_fields) | set(table)
    assert theirs - ours == set(), f"SGLang's {cls} fields FleetRL does not know"
