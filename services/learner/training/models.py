"""Load the actor, the frozen reference and the critic from local Hugging Face directories.

The critic is a causal-LM trunk with a scalar value head: ``AutoModelForSequenceClassification``
with one label, whose ``score`` layer is applied to every position (not only the last). Loading it
from a reward-model checkpoint reuses the RM's trunk *and* head (OpenRLHF's "critic initialised
from the reward model"); loading it from a causal LM gives a freshly initialised head.
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import TYPE_CHECKING, TypeAlias, cast

import torch
from torch import nn

from services.learner.settings import LoraSettings, ModelSettings
from services.learner.training.precision import STORAGE_DTYPES

if TYPE_CHECKING:  # transformers and peft load with the model, not with this module
    from peft import PeftModel
    from transformers import PreTrainedModel
    from typing_extensions import TypeIs

    from services.learner.weights.adapter import AdapterWeights

log = logging.getLogger(__name__)

HFModel: TypeAlias = "PreTrainedModel | PeftModel"  # the actor: a Hugging Face model, a peft model with LoRA

DTYPES = STORAGE_DTYPES  # model.dtype -> the dtype parameters are loaded in (auto: fp32 master weights)


def resolve_device(name: str, local_rank: int = 0) -> torch.device:
    """'auto' -> cuda if available, else cpu; a bare 'cuda' is this rank's GPU (``local_rank``, the launcher's
    ``LOCAL_RANK``: :class:`~services.learner.distributed.env.RankInfo`)."""
    if name == "auto":
        name = "cuda" if torch.cuda.is_available() else "cpu"
    if name == "cuda":
        return torch.device("cuda", local_rank)
    return torch.device(name)


def _local_dir(path: str, what: str) -> str:
    p = Path(path)
    if not (p / "config.json").is_file():
        raise FileNotFoundError(f"{what}: {p} is not a local Hugging Face model directory (no config.json)")
    return str(p)


def load_tokenizer(settings: ModelSettings):
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(_local_dir(settings.tokenizer or settings.actor, "tokenizer"))
    if tok.pad_token_id is None:
        tok.pad_token = tok.eos_token
    return tok


def load_causal_lm(path: str, settings: ModelSettings, device: torch.device, what: str) -> PreTrainedModel:
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(_local_dir(path, what), dtype=DTYPES[settings.dtype])
    model.config.use_cache = False
    return model.to(device)  # type: ignore[arg-type]  # transformers' stub: .to wrapped without device


def is_peft(model: nn.Module) -> TypeIs[PeftModel]:
    """A peft model (LoRA adapters), told by its ``merge_and_unload`` without importing peft."""
    return hasattr(model, "merge_and_unload")


def hf_base(actor: PeftModel) -> PreTrainedModel:
    """The Hugging Face model under peft's adapters (peft types ``get_base_model`` as a plain ``nn.Module``)."""
    return cast("PreTrainedModel", actor.get_base_model())


def load_actor(settings: ModelSettings, device: torch.device, adapter_dir: str | None = None) -> HFModel:
    """The trainable policy; with LoRA, a peft model (``adapter_dir`` resumes saved adapters)."""
    model = load_causal_lm(settings.actor, settings, device, "model.actor")
    if settings.gradient_checkpointing:
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    if settings.lora is not None:
        return apply_lora(model, settings.lora, adapter_dir)
    return model


def apply_lora(model: PreTrainedModel, lora: LoraSettings, adapter_dir: str | None = None) -> PeftModel:
    from peft import LoraConfig, PeftModel, get_peft_model

    if adapter_dir is not None:
        peft_model = PeftModel.from_pretrained(model, adapter_dir, is_trainable=True)
    else:
        config = LoraConfig(r=lora.rank, lora_alpha=lora.alpha, lora_dropout=lora.dropout,
                            target_modules=lora.target_modules, task_type="CAUSAL_LM")
        if getattr(model, "is_gradient_checkpointing", False):
            model.enable_input_require_grads()
        peft_model = get_peft_model(model, config)
    log.info("%s", lora_line(peft_model, lora))
    return peft_model


def lora_line(model: nn.Module, lora: LoraSettings) -> str:
    """The line the learner logs at start with LoRA on: its shape and how many parameters train."""
    trainable = sum(p.numel() for p in model.parameters() if p.requires_grad)
    total = sum(p.numel() for p in model.parameters())
    return (f"LoRA on: rank {lora.rank}, alpha {lora.alpha}, target {lora.target_modules}: {trainable:,} of "
            f"{total:,} parameters train ({trainable / max(total, 1):.2%})")


def load_reference(settings: ModelSettings, device: torch.device) -> PreTrainedModel:
    model = load_causal_lm(settings.reference or settings.actor, settings, device, "model.reference")
    model.eval()
    model.requires_grad_(False)
    return model


class Critic(nn.Module):
    """Per-token values: a transformer trunk plus a linear head from hidden size to 1."""

    def __init__(self, seq_cls_model: PreTrainedModel) -> None:
        super().__init__()
        self.inner = seq_cls_model

    @property
    def trunk(self) -> nn.Module:
        return getattr(self.inner, self.inner.base_model_prefix)

    @property
    def score(self) -> nn.Module:
        """The value head (the sequence-classification model's ``score`` layer)."""
        return self.inner.get_submodule("score")

    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
        hidden = self.trunk(input_ids=input_ids, attention_mask=attention_mask).last_hidden_state
        return self.score(hidden).squeeze(-1).float()  # [B, L]

    def save_pretrained(self, out_dir: str | Path, **kwargs) -> None:
        """HF sequence-classification format: reloadable as a critic or served as a reward model."""
        self.inner.save_pretrained(out_dir, **kwargs)


def load_critic(path: str, settings: ModelSettings, device: torch.device) -> Critic:
    from transformers import AutoConfig, AutoModelForSequenceClassification

    path = _local_dir(path, "model.critic")
    config = AutoConfig.from_pretrained(path)
    from_rm = any(a.endswith("ForSequenceClassification") for a in (config.architectures or []))
    config.num_labels = 1
    model = AutoModelForSequenceClassification.from_pretrained(path, config=config, dtype=DTYPES[settings.dtype])
    log.info("critic from %s (%s)", path, "reward model: trunk and head reused" if from_rm else "causal LM: new head")
    if settings.gradient_checkpointing:
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    return Critic(model).to(device)


def merged_state_dict(actor: nn.Module) -> dict[str, torch.Tensor]:
    """The actor's weights under the base model's names (LoRA merged in), for publishing / export.

    With LoRA adapters, each adapted layer's weight is computed as ``W + delta`` (peft's own
    ``get_delta_weight``: scaling and fan-in/fan-out handled there) into a new tensor; every other tensor
    is the actor's own (no copy). The actor is left as it was: nothing is merged into it, and no second
    model is built (a deep copy per publish would double the memory of a large actor). Setups this does
    not cover (adapter types other than LoRA, ``modules_to_save``) fall back to merging a deep copy."""
    if not is_peft(actor):
        return actor.state_dict()
    merged = _lora_merged_state_dict(actor)
    if merged is not None:
        return merged
    import copy

    return copy.deepcopy(actor).merge_and_unload().state_dict()


@torch.no_grad()
def _lora_merged_state_dict(actor: PeftModel) -> dict[str, torch.Tensor] | None:
    from peft.tuners.lora import LoraLayer

    base = actor.get_base_model()
    lora: dict[str, LoraLayer] = {}
    for name, module in base.named_modules():
        if isinstance(module, LoraLayer):
            lora[name] = module
        elif type(module).__name__ in ("ModulesToSaveWrapper", "TrainableTokensWrapper") or \
                (hasattr(module, "base_layer") and not isinstance(module, LoraLayer)):
            return None  # another wrapper kind: let peft merge a copy
    out: dict[str, torch.Tensor] = {}
    for key, tensor in base.state_dict().items():
        owner, _, leaf = key.rpartition(".")
        layer_name = owner.removesuffix(".base_layer") if owner.endswith(".base_layer") else None
        if layer_name is not None and layer_name in lora:
            layer = lora[layer_name]
            if leaf == "weight" and not layer.merged and not getattr(layer, "disable_adapters", False):
                for adapter in layer.active_adapters:
                    if adapter in layer.lora_A or adapter in getattr(layer, "lora_embedding_A", {}):
                        # one rounding, as peft's in-place merge does: add in the promoted dtype, then cast
                        delta = layer.get_delta_weight(adapter)  # type: ignore[attr-defined]  # peft: per layer class
                        tensor = (tensor + delta).to(tensor.dtype)
            out[f"{layer_name}.{leaf}"] = tensor
        elif not _is_adapter_tensor(owner, lora):
            out[key] = tensor
    return out


@torch.no_grad()
def lora_adapter(actor: nn.Module) -> tuple[list[tuple[str, torch.Tensor]], dict] | None:
    """The actor's LoRA adapter for an adapter round: ``[(f"{module}.lora_A", A), (f"{module}.lora_B", B), ...]``
    (base-model module names, the adapter's own tensors: no copy) and ``{"rank", "alpha", "use_rslora",
    "modules": [{"name", "scaling", "fan_in_fan_out"}]}``. None where an adapter round cannot carry it (not a
    peft LoRA model, several or merged adapters, DoRA, LoRA on embeddings, ``modules_to_save``, per-module ranks
    or alphas): the merged model is published then."""
    if not is_peft(actor) or not hasattr(actor, "peft_config"):
        return None
    from peft.tuners.lora import LoraConfig, LoraLayer

    if len(actor.peft_config) != 1:
        return None
    adapter, config = next(iter(actor.peft_config.items()))
    if not isinstance(config, LoraConfig):  # another adapter kind: no LoRA layers either
        return None
    if getattr(config, "rank_pattern", None) or getattr(config, "alpha_pattern", None) or \
            getattr(config, "modules_to_save", None) or getattr(config, "use_dora", False):
        return None
    tensors: list[tuple[str, torch.Tensor]] = []
    modules: list[dict] = []
    for name, module in actor.get_base_model().named_modules():
        if isinstance(module, LoraLayer):
            if module.merged or adapter not in module.lora_A or module.lora_embedding_A:
                return None
            if getattr(module, "use_dora", {}).get(adapter, False):
                return None
            # in the adapted weight's dtype (what the replica serves in: peft keeps a bf16 model's adapters in
            # fp32, twice the bytes, and a merge rounds to the weight's dtype anyway); no copy when they match
            weight = module.get_base_layer().weight
            assert isinstance(weight, torch.Tensor)  # a LoRA layer adapts a layer with a weight
            dtype = weight.dtype
            a, b = module.lora_A[adapter].weight, module.lora_B[adapter].weight
            assert isinstance(a, torch.Tensor) and isinstance(b, torch.Tensor)  # the adapter's two nn.Linear
            tensors += [(f"{name}.lora_A", a.detach().to(dtype)), (f"{name}.lora_B", b.detach().to(dtype))]
            modules.append({"name": name, "scaling": float(module.scaling[adapter]),
                            "fan_in_fan_out": bool(getattr(module, "fan_in_fan_out", False))})
        elif type(module).__name__ in ("ModulesToSaveWrapper", "TrainableTokensWrapper"):
            return None
    if not modules:
        return None
    if any(p.requires_grad for n, p in actor.get_base_model().named_parameters() if ".lora_" not in n):
        return None  # base weights train too (a tied unembedding trained directly): only the merged model has them
    return tensors, {"rank": int(config.r), "alpha": float(config.lora_alpha),
                     "use_rslora": bool(getattr(config, "use_rslora", False)), "modules": modules}


def adapter_weights(actor: nn.Module) -> AdapterWeights | None:
    """The actor's version as an :class:`~services.learner.weights.adapter.AdapterWeights` (the adapter, and the
    merged model for replicas that cannot load adapters), or None where :func:`lora_adapter` is None."""
    got = lora_adapter(actor)
    if got is None:
        return None
    from services.learner.weights.adapter import AdapterWeights
    from shared.weight_sync.wire import AdapterInfo

    tensors, info = got
    return AdapterWeights(tensors, AdapterInfo.model_validate(info), merged=lambda: merged_state_dict(actor))


def _is_adapter_tensor(owner: str, lora: dict) -> bool:
    """``<layer>.lora_A.<adapter>`` and the like: LoRA's own tensors, not part of the base model."""
    parts = owner.split(".")
    return any(part.startswith("lora_") and ".".join(parts[:i]) in lora for i, part in enumerate(parts))


def save_actor_export(actor: HFModel, tokenizer, out_dir: str | Path,
                      state_dict: dict[str, torch.Tensor] | None = None) -> None:
    """Save a plain HF checkpoint of the actor (LoRA merged in) that any engine can load (``state_dict``: the
    full weights where the actor's own are sharded)."""
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    if is_peft(actor):
        merged = _lora_merged_state_dict(actor)
        if merged is not None:  # the base model's own save, given the merged weights: no second model in memory
            hf_base(actor).save_pretrained(out, state_dict=merged, safe_serialization=True)
        else:
            import copy

            copy.deepcopy(actor).merge_and_unload().save_pretrained(out, safe_serialization=True)
    else:
        actor.save_pretrained(out, state_dict=state_dict, safe_serialization=True)
    tokenizer.save_pretrained(out)
