"""A Hugging Face sequence-classification reward model, dynamically batched.

The reward of a sequence is the value head's output at its last non-pad token (by attention mask,
as OpenRLHF computes it), so OpenRLHF RM checkpoints (``model.*`` + ``score.weight``, optional
``normalize_reward``/``mean``/``std`` in config.json) and ordinary ``*ForSequenceClassification``
checkpoints load alike. Sequences are right-padded, so every token keeps the positions it has in an
unbatched pass.
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from typing import TYPE_CHECKING

from services.reward.scorers.base import Scorer, render_prompt, strip_tokens
from services.reward.scorers.batcher import DynamicBatcher
from shared.reward_api import ScoreItem

if TYPE_CHECKING:
    import torch


def _pick_device(device: str) -> str:
    import torch

    if device == "auto":
        return "cuda" if torch.cuda.is_available() else "cpu"
    return device


def _pick_dtype(dtype: str, device: str):
    import torch

    if dtype == "auto":
        return torch.bfloat16 if device.startswith("cuda") else torch.float32
    return getattr(torch, dtype)


class RewardModel:
    """The loaded model + tokenizer; ``forward(texts)`` is synchronous (runs in the batcher's thread)."""

    def __init__(self, config):
        import torch
        from transformers import AutoModelForSequenceClassification, AutoTokenizer

        if config.torch_threads:
            torch.set_num_threads(config.torch_threads)
        self.config = config
        self.device = _pick_device(config.device)
        self.tokenizer = AutoTokenizer.from_pretrained(config.model)
        if self.tokenizer.pad_token is None:
            self.tokenizer.pad_token = self.tokenizer.eos_token
        self.tokenizer.padding_side = "right"
        self.tokenizer.truncation_side = "left"  # keep the end: that is where the reward is read
        model = AutoModelForSequenceClassification.from_pretrained(
            config.model, num_labels=1, dtype=_pick_dtype(config.dtype, self.device)
        )
        self.model = model.to(self.device).eval()
        backbone = getattr(model, model.base_model_prefix, None)
        head = getattr(model, config.head, None)
        if backbone is None or head is None:
            raise ValueError(
                f"{config.model}: model {type(model).__name__} has no backbone `{model.base_model_prefix}` or "
                f"value head `{config.head}`; set `head` to the name of its output layer"
            )
        self.backbone: torch.nn.Module = backbone
        self.head: torch.nn.Module = head
        mcfg = model.config
        normalize = config.normalize if config.normalize is not None else bool(getattr(mcfg, "normalize_reward", False))
        self.mean = float(getattr(mcfg, "mean", 0.0)) if normalize else 0.0
        self.std = float(getattr(mcfg, "std", 1.0)) if normalize else 1.0
        self._specials = [t for t in (self.tokenizer.pad_token, self.tokenizer.eos_token) if t]

    def text(self, item: ScoreItem) -> str:
        """The sequence the model reads: chat template for messages (when the tokenizer has one), else prompt + response."""
        if isinstance(item.prompt, list) and self.tokenizer.chat_template:
            messages = [m.model_dump() for m in item.prompt] + [{"role": "assistant", "content": item.response}]
            rendered = self.tokenizer.apply_chat_template(messages, tokenize=False)
            if not isinstance(rendered, str):  # tokenize=False renders text
                raise TypeError(f"{self.config.model}: the chat template gave {type(rendered).__name__}, not text")
            text = rendered
        else:
            text = render_prompt(item.prompt) + item.response
        if self.config.append_eos and self.tokenizer.eos_token:
            text = strip_tokens(text, self._specials, head=False) + self.tokenizer.eos_token
        return text

    def forward(self, texts: list[str]) -> list[float]:
        import torch

        enc = self.tokenizer(
            texts, return_tensors="pt", padding=True, truncation=True, max_length=self.config.max_length,
            add_special_tokens=False,
        ).to(self.device)
        mask = enc["attention_mask"]
        with torch.inference_mode():
            hidden = self.backbone(input_ids=enc["input_ids"], attention_mask=mask).last_hidden_state
            values = self.head(hidden).squeeze(-1).float()  # [batch, seq]
        last = mask.size(1) - 1 - mask.long().fliplr().argmax(dim=1)
        rewards = values.gather(1, last.unsqueeze(1)).squeeze(1)
        rewards = (rewards - self.mean) / self.std
        return rewards.cpu().tolist()


class HfRmScorer(Scorer):
    """Reward model scorer; concurrent requests share batches up to ``max_batch_size``."""

    kind = "hf_rm"

    def __init__(self, config, metrics):
        super().__init__(config, metrics)
        self.rm: RewardModel | None = None
        self._batcher: DynamicBatcher[str] | None = None

    async def start(self) -> None:
        self.rm = await asyncio.to_thread(RewardModel, self.config)
        self._batcher = DynamicBatcher(
            self.rm.forward,
            max_batch_size=self.config.max_batch_size,
            max_wait_s=self.config.max_wait_ms / 1000.0,
            name=f"reward-{self.name}",
            on_batch=self.metrics.batch_size.labels(self.name).observe,
        )
        await self._batcher.start()

    async def close(self) -> None:
        if self._batcher is not None:
            await self._batcher.close()

    def _started(self) -> tuple[RewardModel, DynamicBatcher[str]]:
        if self.rm is None or self._batcher is None:
            raise RuntimeError(f"reward model scorer {self.name!r} used before start()")
        return self.rm, self._batcher

    async def check(self) -> None:
        await self._started()[1].submit(["health check"])

    async def score(self, items: Sequence[ScoreItem]) -> list[float]:
        rm, batcher = self._started()
        # the texts (chat template, special tokens) are built in a thread: their cost grows with the response
        texts = await asyncio.to_thread(lambda: [rm.text(item) for item in items])
        return await batcher.submit(texts)
