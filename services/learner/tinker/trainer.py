"""One training model of the Tinker API: the base model (with LoRA adapters through peft, or all weights),
its AdamW optimizer, forward_backward with Tinker's losses, optim_step with per-step AdamParams, and its state
on disk. Not thread-safe: each model's calls run one at a time on its own worker (service.py)."""

from __future__ import annotations

import json
import logging
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch
from safetensors.torch import load_file, save_file

from services.learner.settings import LoraSettings, ModelSettings
from services.learner.tinker.errors import BadRequest
from services.learner.tinker.losses import lookup
from services.learner.tinker.wire import DatumIn
from services.learner.training.models import (
    HFModel,
    apply_lora,
    load_causal_lm,
    resolve_device,
    save_actor_export,
)

log = logging.getLogger(__name__)

ATTN = ("q_proj", "k_proj", "v_proj", "o_proj")
MLP = ("gate_proj", "up_proj", "down_proj", "fc1", "fc2", "w1", "w2", "w3")
UNEMBED = ("lm_head",)


@dataclass(frozen=True)
class ModelSpec:
    """What a model was created with (saved beside its state, so create-from-state rebuilds it)."""

    base_model: str
    lora_rank: int | None
    train_attn: bool = True
    train_mlp: bool = True
    train_unembed: bool = True
    seed: int = 0

    def to_json(self) -> dict:
        return self.__dict__.copy()


@dataclass(frozen=True)
class AdamStep:
    learning_rate: float
    beta1: float
    beta2: float
    eps: float
    weight_decay: float
    grad_clip_norm: float


class TinkerModel:
    def __init__(self, spec: ModelSpec, base_dir: str, *, device: str, dtype: str, lora_alpha: int,
                 micro_batch_size: int) -> None:
        self.spec = spec
        self.device = resolve_device(device)
        self.micro = micro_batch_size
        torch.manual_seed(spec.seed)
        settings = ModelSettings(actor=base_dir, dtype=dtype, device=device)
        base = load_causal_lm(base_dir, settings, self.device, "base_model")
        model: HFModel = base
        if spec.lora_rank is not None:
            targets = self._lora_targets(base)
            model = apply_lora(base, LoraSettings(rank=spec.lora_rank, alpha=lora_alpha, target_modules=targets))
            if spec.train_unembed and self._tied(model):
                # the output layer is the input embedding: it is trained in full (one tensor for both, as the
                # rollout replicas and the exported checkpoint hold it), not through an adapter that unties them
                model.get_input_embeddings().weight.requires_grad_(True)
        self.model = model
        self.vocab = int(model.config.vocab_size)
        self.max_len = int(getattr(model.config, "max_position_embeddings", 0) or 1 << 30)
        self.params = [p for p in model.parameters() if p.requires_grad]
        self.names = [n for n, p in model.named_parameters() if p.requires_grad]
        self.optimizer = torch.optim.AdamW(self.params, lr=1e-4, betas=(0.9, 0.95), eps=1e-12, weight_decay=0.0)
        self.steps = 0

    def _lora_targets(self, model: HFModel) -> list[str]:
        # a model whose output layer is its input embedding (tie_word_embeddings) gets no adapter on the output
        # layer: one there unties the two, and the weights published to a rollout replica (whose model holds one
        # tensor for both) could not hold what was trained (tests/tinker/test_rollout_sampling.py: 0.1-0.5 off);
        # train_unembed trains the shared matrix itself instead (__init__)
        wanted = (ATTN if self.spec.train_attn else ()) + (MLP if self.spec.train_mlp else ()) + \
            (UNEMBED if self.spec.train_unembed and not self._tied(model) else ())
        leaves = {name.rsplit(".", 1)[-1] for name, m in model.named_modules() if isinstance(m, torch.nn.Linear)}
        targets = sorted(leaves & set(wanted))
        if not targets:
            raise BadRequest(f"LoRA: none of the layers asked for ({', '.join(wanted)}) is in this model")
        return targets

    @staticmethod
    def _tied(model: HFModel) -> bool:
        out = model.get_output_embeddings()
        return out is not None and out.weight is model.get_input_embeddings().weight

    # ---- forward / backward -------------------------------------------------------------------------
    def forward_backward(self, data: list[DatumIn], loss_fn: str, config: dict, forward_only: bool
                         ) -> tuple[list[dict[str, np.ndarray]], dict[str, float]]:
        """Each datum's target logprobs, and ``loss:sum``; with ``forward_only`` False the gradients of the
        summed loss accumulate until the next optim_step."""
        loss = lookup(loss_fn, config)
        batch = [self._checked(i, d, loss.required, loss.optional) for i, d in enumerate(data)]
        outputs: list[dict[str, np.ndarray]] = []
        total = 0.0
        self.model.train(not forward_only)
        for start in range(0, len(batch), self.micro):
            part = batch[start:start + self.micro]
            with torch.set_grad_enabled(not forward_only):
                logps = self._target_logprobs([t for t, _ in part], [x["target_tokens"] for _, x in part])
                losses = [loss.fn(lp, x, config) for lp, (_, x) in zip(logps, part, strict=True)]
                part_loss = torch.stack(losses).sum()
                if not forward_only:
                    part_loss.backward()
            total += float(part_loss.detach())
            outputs.extend({"logprobs": lp.detach().float().cpu().numpy()} for lp in logps)
        return outputs, {"loss:sum": total}

    def _checked(self, i: int, d: DatumIn, required: tuple[str, ...], optional: tuple[str, ...]
                 ) -> tuple[list[int], dict[str, torch.Tensor]]:
        n = len(d.tokens)
        if n == 0:
            raise BadRequest(f"data[{i}]: the model input is empty")
        if n > self.max_len:
            raise BadRequest(f"data[{i}]: {n} tokens, more than the model's {self.max_len}")
        if min(d.tokens) < 0 or max(d.tokens) >= self.vocab:
            raise BadRequest(f"data[{i}]: token ids must lie in [0, {self.vocab})")
        missing = [k for k in required if k not in d.inputs]
        if missing:
            raise BadRequest(f"data[{i}]: loss_fn_inputs lacks {missing}")
        out: dict[str, torch.Tensor] = {}
        for key in (*required, *optional):
            if key not in d.inputs:
                continue
            arr = d.inputs[key]
            if arr.shape != (n,):
                raise BadRequest(f"data[{i}]: loss_fn_inputs[{key!r}] has shape {list(arr.shape)}, the model "
                                 f"input has {n} tokens (one value per token: shape [{n}])")
            if key == "target_tokens":
                if arr.min() < 0 or arr.max() >= self.vocab:
                    raise BadRequest(f"data[{i}]: target_tokens must lie in [0, {self.vocab})")
                out[key] = torch.as_tensor(arr.astype(np.int64), device=self.device)
            else:
                if not np.isfinite(arr).all():
                    raise BadRequest(f"data[{i}]: loss_fn_inputs[{key!r}] holds a NaN or infinity")
                out[key] = torch.as_tensor(arr.astype(np.float32), device=self.device)
        return d.tokens, out

    def _target_logprobs(self, inputs: list[list[int]], targets: list[torch.Tensor]) -> list[torch.Tensor]:
        width = max(len(t) for t in inputs)
        ids = torch.zeros((len(inputs), width), dtype=torch.long, device=self.device)
        mask = torch.zeros_like(ids)
        tgt = torch.zeros_like(ids)
        for row, (toks, target) in enumerate(zip(inputs, targets, strict=True)):
            ids[row, :len(toks)] = torch.as_tensor(toks, device=self.device)
            mask[row, :len(toks)] = 1
            tgt[row, :len(toks)] = target
        logits = self.model(input_ids=ids, attention_mask=mask).logits.float()
        logp = torch.log_softmax(logits, dim=-1).gather(-1, tgt.unsqueeze(-1)).squeeze(-1)
        return [logp[row, :len(toks)] for row, toks in enumerate(inputs)]

    # ---- optimizer ----------------------------------------------------------------------------------
    def optim_step(self, adam: AdamStep) -> dict[str, float]:
        for group in self.optimizer.param_groups:
            group.update(lr=adam.learning_rate, betas=(adam.beta1, adam.beta2), eps=adam.eps,
                         weight_decay=adam.weight_decay)
        max_norm = adam.grad_clip_norm if adam.grad_clip_norm > 0 else float("inf")
        norm = torch.nn.utils.clip_grad_norm_(self.params, max_norm)
        self.optimizer.step()
        self.optimizer.zero_grad(set_to_none=True)
        self.steps += 1
        return {"grad_norm:mean": float(norm), "optim_step:sum": 1.0}

    # ---- state --------------------------------------------------------------------------------------
    def save_state(self, out: Path) -> None:
        """Trainable weights (safetensors), optimizer state and the model's spec into ``out`` (fresh)."""
        out.mkdir(parents=True, exist_ok=False)
        save_file({n: p.detach().contiguous().cpu() for n, p in zip(self.names, self.params, strict=True)},
                  str(out / "weights.safetensors"))
        torch.save({"optimizer": self.optimizer.state_dict(), "steps": self.steps}, out / "optimizer.pt")
        (out / "spec.json").write_text(json.dumps(self.spec.to_json()))

    def load_state(self, src: Path, optimizer: bool) -> None:
        spec = read_spec(src)
        if (spec.lora_rank, spec.train_attn, spec.train_mlp, spec.train_unembed) != \
                (self.spec.lora_rank, self.spec.train_attn, self.spec.train_mlp, self.spec.train_unembed):
            raise BadRequest(f"the checkpoint was saved from another model shape ({spec}); load it with "
                             "create_training_client_from_state instead")
        weights = load_file(str(src / "weights.safetensors"), device=str(self.device))
        if set(weights) != set(self.names):
            raise BadRequest("the checkpoint's weights do not match this model's trainable parameters")
        with torch.no_grad():
            for name, p in zip(self.names, self.params, strict=True):
                p.copy_(weights[name])
        self.optimizer.zero_grad(set_to_none=True)
        if optimizer:
            state = torch.load(src / "optimizer.pt", map_location=self.device, weights_only=True)
            self.optimizer.load_state_dict(state["optimizer"])
            self.steps = int(state["steps"])

    def export_for_sampler(self, out: Path, tokenizer_dir: str) -> None:
        """A plain HF checkpoint (LoRA merged in) that any engine loads: the sampler's weights."""
        from transformers import AutoTokenizer

        save_actor_export(self.model, AutoTokenizer.from_pretrained(tokenizer_dir), out)


def read_spec(src: Path) -> ModelSpec:
    try:
        return ModelSpec(**json.loads((src / "spec.json").read_text()))
    except (OSError, ValueError, TypeError) as exc:
        raise BadRequest(f"{src.name}: not a checkpoint saved by save_state ({exc})") from exc
