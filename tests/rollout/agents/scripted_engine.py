"""An engine whose model is a script: the reply to a prompt is ``script(prompt_text)``, as the tiny model's
tokenizer encodes it, then ``<|im_end|>``; stop ids and max_new_tokens apply as in a real engine (the stop
token is part of the output). Lets tests make the model call tools, write broken JSON or answer, exactly."""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable

from services.rollout.engines.base import Engine
from services.rollout.engines.settings import HFEngineSettings
from services.rollout.engines.types import Finish, SequenceDelta, SequenceRequest

IM_END = 4


class ScriptedEngine(Engine):
    kind = "scripted"

    def __init__(self, model_dir: str, script: Callable[[str], str], context_length: int = 512) -> None:
        super().__init__(HFEngineSettings(context_length=context_length), model_dir)
        self.script = script
        self.calls = 0

    async def _start(self) -> None:
        return None

    async def _stop(self) -> None:
        return None

    async def _probe(self) -> bool:
        return True

    async def abort(self, rid: str) -> None:
        return None

    async def _abort_all(self) -> None:
        return None

    async def _stream(self, request: SequenceRequest) -> AsyncIterator[SequenceDelta]:
        self.calls += 1
        prompt = self.tokenizer.decode(list(request.prompt_ids), skip_special_tokens=False)
        ids = [*self.tokenizer.encode(self.script(prompt), add_special_tokens=False), IM_END]
        p = request.params
        out, finish = [], None
        for tok in ids:
            out.append(tok)
            if tok in p.stop_token_ids:
                finish = Finish("stop", matched=tok)
                break
            if len(out) >= p.max_new_tokens:
                finish = Finish("length", length=len(out))
                break
        finish = finish or Finish("stop", matched=IM_END)
        text = self.tokenizer.decode(out, skip_special_tokens=True)
        yield SequenceDelta(token_ids=out, logprobs=[-0.25] * len(out), text=text, finish=finish)
