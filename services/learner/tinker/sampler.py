"""Sampling for the Tinker API, in-process: a loaded HF checkpoint (the base model or a sampler snapshot that
save_weights_for_sampler wrote) generates ``num_samples`` continuations of one prompt with a KV cache.

Logprobs are the model's own (log-softmax of the raw logits, before temperature / top-k / top-p), the numbers
the trainer computes for the same tokens. Stop: the stop token ids, or stop strings on the decoded text, or
(``stop`` unset) the model's EOS; the stopping token is part of the output."""

from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass
from pathlib import Path

import torch

from services.learner.settings import ModelSettings
from services.learner.tinker.errors import BadRequest
from services.learner.tinker.wire import SampledOut
from services.learner.training.models import load_causal_lm, resolve_device


@dataclass(frozen=True)
class SampleCall:
    prompt: list[int]
    num_samples: int
    max_tokens: int
    temperature: float
    top_k: int
    top_p: float
    seed: int | None
    stop_tokens: tuple[int, ...] | None
    stop_strings: tuple[str, ...]
    prompt_logprobs: bool


class LoadedSampler:
    def __init__(self, model_dir: str, device: str, dtype: str) -> None:
        from transformers import AutoTokenizer

        self.device = resolve_device(device)
        self.model = load_causal_lm(model_dir, ModelSettings(actor=model_dir, dtype=dtype, device=device),
                                    self.device, "sampler")
        self.model.eval()
        self.tokenizer = AutoTokenizer.from_pretrained(model_dir)
        eos = self.model.config.eos_token_id
        self.eos = tuple(eos) if isinstance(eos, list) else ((eos,) if eos is not None else ())
        self.vocab = int(self.model.config.vocab_size)
        self.max_len = int(getattr(self.model.config, "max_position_embeddings", 0) or 1 << 30)

    @torch.no_grad()
    def sample(self, call: SampleCall) -> tuple[list[SampledOut], list[float | None] | None]:
        if not call.prompt:
            raise BadRequest("prompt: empty")
        if min(call.prompt) < 0 or max(call.prompt) >= self.vocab:
            raise BadRequest(f"prompt: token ids must lie in [0, {self.vocab})")
        if len(call.prompt) + call.max_tokens > self.max_len:
            raise BadRequest(f"prompt ({len(call.prompt)} tokens) + max_tokens ({call.max_tokens}) is more than "
                             f"the model's context of {self.max_len}")
        gen = torch.Generator(device=self.device)
        gen.manual_seed(call.seed if call.seed is not None else int(torch.randint(0, 2**62, ()).item()))
        n = call.num_samples
        ids = torch.tensor([call.prompt] * n, dtype=torch.long, device=self.device)
        out = self.model(input_ids=ids, use_cache=True)
        prompt_lp: list[float | None] | None = None
        if call.prompt_logprobs:
            lp = torch.log_softmax(out.logits[0, :-1].float(), dim=-1)
            tgt = torch.tensor(call.prompt[1:], device=self.device)
            prompt_lp = [None, *lp.gather(-1, tgt.unsqueeze(-1)).squeeze(-1).tolist()]
        stop_ids = set(call.stop_tokens) if call.stop_tokens is not None else \
            (set(self.eos) if not call.stop_strings else set())
        tokens: list[list[int]] = [[] for _ in range(n)]
        logps: list[list[float]] = [[] for _ in range(n)]
        reasons = ["length"] * n
        done = [False] * n
        past, logits = out.past_key_values, out.logits[:, -1]
        for _ in range(call.max_tokens):
            raw = torch.log_softmax(logits.float(), dim=-1)
            nxt = self._pick(logits.float(), call, gen)
            chosen = raw.gather(-1, nxt.unsqueeze(-1)).squeeze(-1).tolist()
            for i, (tok, lp) in enumerate(zip(nxt.tolist(), chosen, strict=True)):
                if done[i]:
                    continue
                tokens[i].append(tok)
                logps[i].append(lp)
                if tok in stop_ids or (call.stop_strings and self._hit_stop_string(tokens[i], call.stop_strings)):
                    done[i], reasons[i] = True, "stop"
            if all(done):
                break
            out = self.model(input_ids=nxt.unsqueeze(-1), past_key_values=past, use_cache=True)
            past, logits = out.past_key_values, out.logits[:, -1]
        return [SampledOut(t, lp, r) for t, lp, r in zip(tokens, logps, reasons, strict=True)], prompt_lp

    def _hit_stop_string(self, toks: list[int], stops: tuple[str, ...]) -> bool:
        tail = self.tokenizer.decode(toks[-32:], skip_special_tokens=False)
        return any(s in tail for s in stops)

    @staticmethod
    def _pick(logits: torch.Tensor, call: SampleCall, gen: torch.Generator) -> torch.Tensor:
        if call.temperature <= 0.0:
            return logits.argmax(-1)
        scaled = logits / call.temperature
        if call.top_k > 0:
            kth = torch.topk(scaled, min(call.top_k, scaled.shape[-1]), dim=-1).values[:, -1:]
            scaled = scaled.masked_fill(scaled < kth, float("-inf"))
        if call.top_p < 1.0:
            sorted_logits, order = torch.sort(scaled, descending=True, dim=-1)
            probs = torch.softmax(sorted_logits, dim=-1)
            drop = probs.cumsum(-1) - probs > call.top_p
            sorted_logits = sorted_logits.masked_fill(drop, float("-inf"))
            scaled = torch.full_like(scaled, float("-inf")).scatter(-1, order, sorted_logits)
        probs = torch.softmax(scaled, dim=-1)
        return torch.multinomial(probs, 1, generator=gen).squeeze(-1)


class SamplerCache:
    """The last ``size`` sampler checkpoints used, loaded (least recently used goes first)."""

    def __init__(self, size: int, device: str, dtype: str) -> None:
        self.size, self.device, self.dtype = size, device, dtype
        self._loaded: OrderedDict[str, LoadedSampler] = OrderedDict()

    def get(self, model_dir: Path | str) -> LoadedSampler:
        key = str(model_dir)
        if key in self._loaded:
            self._loaded.move_to_end(key)
            return self._loaded[key]
        sampler = LoadedSampler(key, self.device, self.dtype)
        self._loaded[key] = sampler
        while len(self._loaded) > self.size:
            self._loaded.popitem(last=False)
        return sampler
