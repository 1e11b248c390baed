"""The prompt set on local disk: JSONL, Parquet (pyarrow), or a saved Hugging Face dataset directory.

Rows are dicts; ``data.input_key`` holds the prompt (text, or chat messages as a list of
``{"role", "content"}``), ``data.label_key`` the label for the reward service, ``data.output_key`` the
answer (SFT: text, or a multi-turn transcript as segments ``{"text", "train"}`` whose ``train: false`` segments —
environment and tool turns — are context, not loss); a dotted key names a nested field. Both OpenRLHF's layout (``input_key: input``,
``label_key: label``) and verl's (``input_key: prompt``, ``label_key: reward_model.ground_truth``, with
``data_source`` and ``extra_info`` passed to the reward function through ``data.metadata_keys``) read as they
are. Each epoch visits the rows in a permutation seeded by ``seed + epoch``, so a dataset
position ``(epoch, index)`` names the same row after a restart.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from services.learner.settings import DataSettings, RolloutRequestSettings
from shared.chat_prompt import ChatPromptError, chat_prompt_ids, text_prompt_ids
from shared.group_id import GroupId
from shared.schemas import ChatMessage, PromptTask


class DataError(ValueError):
    """The prompt set cannot be read or lacks a field; the message says which and where."""


def _read_jsonl(path: Path) -> list[dict]:
    rows = []
    with path.open() as f:
        for n, line in enumerate(f, 1):
            if not line.strip():
                continue
            try:
                row = json.loads(line)
            except json.JSONDecodeError as exc:
                raise DataError(f"{path}:{n}: not valid JSON ({exc.msg})") from exc
            if not isinstance(row, dict):
                raise DataError(f"{path}:{n}: each line must be a JSON object")
            rows.append(row)
    return rows


def _read_parquet(path: Path) -> list[dict]:
    import pyarrow.parquet as pq

    return pq.read_table(path).to_pylist()


def _read_hf_dataset(path: Path, split: str) -> list[dict]:
    try:
        import datasets  # optional extra: fleetrl[data]
    except ImportError as exc:
        raise DataError(f"{path} looks like a saved HF dataset; install the `data` extra (datasets)") from exc
    ds = datasets.load_from_disk(str(path))
    if isinstance(ds, datasets.DatasetDict):
        if split not in ds:
            raise DataError(f"{path}: no split {split!r} (has {sorted(ds)}); set data.split")
        ds = ds[split]
    return ds.to_list()


def read_rows(path: str | Path, split: str = "train") -> list[dict]:
    p = Path(path)
    if p.is_dir():
        return _read_hf_dataset(p, split)
    if not p.is_file():
        raise DataError(f"data.path {p} does not exist")
    readers = {".jsonl": _read_jsonl, ".json": _read_jsonl, ".parquet": _read_parquet}
    if p.suffix not in readers:
        raise DataError(f"data.path {p}: use .jsonl, .parquet or a saved HF dataset directory")
    return readers[p.suffix](p)


_MISSING = object()


def field_value(row: dict, key: str, default: Any = _MISSING) -> Any:
    """``row[key]``; a dotted key walks nested mappings (verl's ``reward_model.ground_truth``) unless the row has
    a field of that literal name. Without ``default``, a missing field raises KeyError."""
    if key in row:
        return row[key]
    node: Any = row
    for part in key.split("."):
        if not isinstance(node, dict) or part not in node:
            if default is _MISSING:
                raise KeyError(key)
            return default
        node = node[part]
    return node


def _has(row: dict, key: str) -> bool:
    try:
        field_value(row, key)
    except KeyError:
        return False
    return True


def row_metadata(row: dict, settings: DataSettings) -> dict[str, Any]:
    """The row's ``data.metadata_keys`` fields it has (verl's ``data_source``, ``extra_info``), passed with each
    prompt to the reward function as they are."""
    return {key: row[key] for key in settings.metadata_keys if key in row}


def row_prompt(row: dict, settings: DataSettings) -> str | list[ChatMessage]:
    """The row's prompt as every consumer gets it: chat messages (a chat-format row, or any row with
    ``data.apply_chat_template``: its text as one user turn), rendered later by the model's chat template where
    the tokens are made (:mod:`shared.chat_prompt`); or text (with ``data.input_template`` applied)."""
    value = field_value(row, settings.input_key)
    if isinstance(value, list):
        return [ChatMessage.model_validate(m) for m in value]
    if settings.apply_chat_template:
        return [ChatMessage(role="user", content=str(value))]
    text = str(value)
    return settings.input_template.format(text) if settings.input_template else text


def prompt_ids_of(tokenizer: Any, prompt: str | list[ChatMessage]) -> list[int]:
    """Token ids of a :func:`row_prompt` exactly as the rollout fleet makes them (:mod:`shared.chat_prompt`)."""
    if isinstance(prompt, list):
        try:
            return chat_prompt_ids(tokenizer, [m.model_dump() for m in prompt])
        except ChatPromptError as exc:
            raise DataError(f"a chat prompt: {exc}") from exc
    return text_prompt_ids(tokenizer, prompt)


def check_fields(rows: list[dict], settings: DataSettings, need_output: bool = False) -> None:
    """Every row has the fields the settings name: ``input_key``, and ``output_key`` (SFT) or ``label_key`` (RL,
    unless it is null): a key naming no field is an error at start, not a run of ``null`` labels. A dotted key
    names a nested field (``reward_model.ground_truth``)."""
    keys = {"input_key": settings.input_key}
    keys.update({"output_key": settings.output_key} if need_output else
                {"label_key": settings.label_key} if settings.label_key else {})
    for n, row in enumerate(rows):
        for setting, key in keys.items():
            if not _has(row, key):
                hint = " (or label_key: null for a reward that needs no label)" if setting == "label_key" else ""
                raise DataError(f"data.{setting} {key!r} names no field of row {n} of {settings.path} (fields: "
                                f"{sorted(row)}): set data.{setting} to one of them{hint}")


def item_id(epoch: int, index: int, attempt: int = 0) -> str:
    """PromptTask id of dataset position (epoch, index); re-issues get an attempt suffix (:class:`GroupId`)."""
    return str(GroupId(epoch, index, attempt))


def parse_item_id(prompt_id: str) -> tuple[str, int] | None:
    """``(position "e{epoch}-{index}", attempt)`` of a PromptTask id, or None if it is not one of ours."""
    gid = GroupId.parse(prompt_id)
    return None if gid is None or "#" in prompt_id else (gid.position, gid.attempt)


@dataclass
class PromptSet:
    settings: DataSettings
    rows: list[dict]
    seed: int
    tokenizer: Any = None

    @classmethod
    def load(cls, settings: DataSettings, seed: int, tokenizer: Any = None, need_output: bool = False) -> PromptSet:
        if settings.path is None:
            raise ValueError("data.path is not set: name the prompt set (JSONL, Parquet or a saved dataset directory)")
        rows = read_rows(settings.path, settings.split)
        if settings.max_samples is not None:
            rows = rows[: settings.max_samples]
        if not rows:
            raise DataError(f"data.path {settings.path} holds no rows")
        check_fields(rows, settings, need_output)
        return cls(settings, rows, seed, tokenizer)

    def __len__(self) -> int:
        return len(self.rows)

    def order(self, epoch: int) -> np.ndarray:
        """Row indices in the order epoch ``epoch`` visits them (cached per epoch)."""
        cache = self.__dict__.setdefault("_orders", {})
        if epoch not in cache:
            if len(cache) > 4:
                cache.clear()
            cache[epoch] = (np.random.RandomState((self.seed + epoch) % 2**32).permutation(len(self.rows))
                            if self.settings.shuffle else np.arange(len(self.rows)))
        return cache[epoch]

    def row(self, epoch: int, index: int) -> dict:
        return self.rows[int(self.order(epoch)[index])]

    def render_prompt(self, row: dict) -> str | list[ChatMessage]:
        return row_prompt(row, self.settings)

    def label(self, row: dict) -> Any:
        key = self.settings.label_key
        return field_value(row, key, None) if key else None

    def task(self, epoch: int, index: int, attempt: int, rollout: RolloutRequestSettings) -> PromptTask:
        row = self.row(epoch, index)
        return PromptTask(id=item_id(epoch, index, attempt), prompt=self.render_prompt(row), label=self.label(row),
                          n=rollout.group_size, sampling=rollout.sampling,
                          metadata={**row_metadata(row, self.settings), "epoch": epoch, "index": index,
                                    "attempt": attempt})

    def sft_pair(self, epoch: int, index: int) -> tuple[list[int], list[int]] | tuple[list[int], list[int], list[int]]:
        """Token ids of (prompt, answer + EOS) for SFT. An answer given as a list of segments
        ``{"text": ..., "train": bool}`` (a multi-turn transcript: the model's turns, and the environment's
        turns with ``train: false``) is tokenised segment by segment, as a multi-turn rollout builds its ids, and
        comes with a third element, the loss mask (1 on the tokens of trained segments and on EOS)."""
        row = self.row(epoch, index)
        prompt_ids = prompt_ids_of(self.tokenizer, self.render_prompt(row))
        if not prompt_ids:
            prompt_ids = [self.tokenizer.bos_token_id or self.tokenizer.eos_token_id]
        output = field_value(row, self.settings.output_key)
        eos = self.tokenizer.eos_token_id
        if not isinstance(output, list):
            answer_ids = list(self.tokenizer(str(output), add_special_tokens=False)["input_ids"])
            return prompt_ids, answer_ids + [eos]
        answer_ids, mask = [], []
        for n, seg in enumerate(output):
            if not isinstance(seg, dict) or not isinstance(seg.get("text"), str):
                raise DataError(f"data.output_key {self.settings.output_key!r}: segment {n} of row {index} is not "
                                '{"text": str, "train": bool}')
            ids = list(self.tokenizer(seg["text"], add_special_tokens=False)["input_ids"])
            answer_ids += ids
            mask += [1 if seg.get("train", True) else 0] * len(ids)
        return prompt_ids, answer_ids + [eos], mask + [1]


CYCLE = 1_000_000
"""Passes over the prompt set of a run that cycles it until ``train.max_steps``."""


@dataclass(frozen=True)
class EpochPlan:
    """How many passes over the prompt set an RL run takes, and what to say about it at start."""

    epochs: int
    note: str | None = None


def epoch_plan(data: DataSettings, groups_per_step: int, max_steps: int | None, rows: int) -> EpochPlan:
    """``train.max_steps`` with ``data.epochs`` left unset cycles the prompts (each pass reshuffled) until
    max_steps, as Hugging Face's ``max_steps`` overrides ``num_train_epochs``; with ``data.epochs`` set, the
    passes cap the run, and when that stops it before max_steps the note says so (logged at start, shown by
    ``fleetrl run``)."""
    steps = -(-rows * data.epochs // groups_per_step)
    if max_steps is None:
        return EpochPlan(data.epochs)
    if "epochs" not in data.model_fields_set:
        passes = max_steps * groups_per_step / rows
        note = (f"data: train.max_steps {max_steps} x train.groups_per_step {groups_per_step} = "
                f"{max_steps * groups_per_step} prompts from {rows}: the prompts are cycled ({passes:.1f} passes, each "
                "reshuffled); set data.epochs to cap the run at whole passes") if passes > 1 else None
        return EpochPlan(CYCLE, note)
    if steps < max_steps:
        return EpochPlan(data.epochs, f"data: train.max_steps {max_steps} is more than the data holds: data.epochs "
                         f"{data.epochs} x {rows} prompts / train.groups_per_step {groups_per_step} = {steps} steps, so "
                         f"the run stops at step {steps}; raise data.epochs, or leave it unset to cycle the prompts "
                         "until max_steps")
    return EpochPlan(data.epochs)


def passes_note(settings: Any) -> str:
    """How a step's samples become forward/backward passes (learner settings): said at start, since a small
    ``train.micro_batch_size`` makes many passes of a big step (a speed trap, not a memory need)."""
    t = settings.train
    samples = t.groups_per_step * settings.rollout.group_size
    if t.micro_batch_tokens is not None:
        return (f"train: a step of {samples} samples is cut into passes of at most {t.micro_batch_tokens} tokens "
                f"(train.micro_batch_tokens; at most {t.micro_batch_size} rows each)")
    passes = -(-samples // t.micro_batch_size)
    hint = (" (raise train.micro_batch_size, or set train.micro_batch_tokens, if memory allows: fewer, bigger "
            "passes are faster)") if passes > 4 else ""
    return (f"train: a step of {samples} samples (train.groups_per_step {t.groups_per_step} x group size "
            f"{settings.rollout.group_size}) is {passes} forward/backward pass{'es' if passes > 1 else ''} of "
            f"train.micro_batch_size "
            f"{t.micro_batch_size}{hint}")
