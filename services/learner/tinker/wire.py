"""The Tinker wire format: forward_backward requests in, forward_backward and sample results out (protobuf).

The schema is the client's own (``tinker.proto.tinker_public_pb2``, from the pinned ``tinker`` package), so the
server reads exactly what the client writes. Token ids arrive packed int32; tensors dense or sparse CSR."""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import numpy as np
from tinker.proto import tinker_public_pb2 as pb

from services.learner.tinker.errors import BadRequest

_NP = {pb.DTYPE_FLOAT32: np.float32, pb.DTYPE_INT64: np.int64, pb.DTYPE_INT32: np.int32}
MAX_DECOMPRESSED = 1 << 30


@dataclass(frozen=True)
class DatumIn:
    """One datum: the model input's tokens and its loss inputs by name (arrays with the datum's length)."""

    tokens: list[int]
    inputs: dict[str, np.ndarray]


@dataclass(frozen=True)
class ForwardBackwardCall:
    model_id: str
    seq_id: int
    loss_fn: str
    loss_fn_config: dict[str, float | str]
    forward_only: bool
    data: list[DatumIn] = field(default_factory=list)


def decompress(body: bytes, content_encoding: str | None) -> bytes:
    """The body as sent before ``Content-Encoding: zstd`` (bounded: a bomb gets 413)."""
    if not content_encoding or content_encoding == "identity":
        return body
    if content_encoding != "zstd":
        raise BadRequest(f"Content-Encoding {content_encoding!r} is not served; send zstd or none", status=415)
    import zstandard

    try:
        out = zstandard.ZstdDecompressor().decompressobj().decompress(body)
    except zstandard.ZstdError as exc:
        raise BadRequest(f"the zstd body does not decompress: {exc}") from exc
    if len(out) > MAX_DECOMPRESSED:
        raise BadRequest("the decompressed body is larger than 1 GiB", status=413)
    return out


def _tensor(msg: pb.Tensor, name: str) -> np.ndarray:
    dtype = _NP.get(msg.dtype)
    if dtype is None:
        raise BadRequest(f"loss_fn_inputs[{name!r}]: dtype {msg.dtype} is not float32 or int64")
    shape = [int(s) for s in msg.shape]
    try:
        if msg.HasField("sparse_csr"):
            if len(shape) != 2:
                raise BadRequest(f"loss_fn_inputs[{name!r}]: a sparse tensor must be 2-D, got shape {shape}")
            values = np.frombuffer(msg.sparse_csr.values, dtype=dtype)
            crow = np.frombuffer(msg.sparse_csr.crow_indices, dtype=np.int64)
            col = np.frombuffer(msg.sparse_csr.col_indices, dtype=np.int64)
            if len(crow) != shape[0] + 1 or len(col) != len(values) or (len(col) and col.max() >= shape[1]):
                raise BadRequest(f"loss_fn_inputs[{name!r}]: the CSR indices do not fit shape {shape}")
            dense = np.zeros(shape, dtype=dtype)
            rows = np.repeat(np.arange(shape[0]), np.diff(crow))
            dense[rows, col] = values
            return dense
        arr = np.frombuffer(msg.dense, dtype=dtype)
        return arr.reshape(shape) if shape else arr
    except ValueError as exc:
        raise BadRequest(f"loss_fn_inputs[{name!r}]: {exc}") from exc


def decode_forward_backward(body: bytes) -> ForwardBackwardCall:
    """Parse a ``ForwardBackwardRequest``; anything malformed is a :class:`BadRequest` naming the field."""
    msg = pb.ForwardBackwardRequest()
    try:
        msg.ParseFromString(body)
    except Exception as exc:  # protobuf's DecodeError and friends
        raise BadRequest(f"the body is not a tinker ForwardBackwardRequest protobuf: {exc}") from exc
    config: dict[str, float | str] = {k: float(v) for k, v in msg.loss_fn_config.items()}
    for k, v in msg.loss_fn_config_v2.items():
        config[k] = v.text if v.WhichOneof("value") == "text" else float(v.number)
    data = []
    for i, d in enumerate(msg.data):
        tokens: list[int] = []
        for chunk in d.model_input:
            kind = chunk.WhichOneof("chunk")
            if kind != "encoded_text":
                raise BadRequest(f"data[{i}]: {kind} chunks are not served (text tokens only)")
            tokens.extend(np.frombuffer(chunk.encoded_text.tokens, dtype=np.int32).tolist())
        data.append(DatumIn(tokens=tokens, inputs={k: _tensor(v, k) for k, v in d.loss_fn_inputs.items()}))
    return ForwardBackwardCall(model_id=msg.model_id, seq_id=int(msg.seq_id), loss_fn=msg.loss_fn,
                               loss_fn_config=config, forward_only=bool(msg.forward_only), data=data)


def _batched(arrays: list[np.ndarray], dtype, pb_dtype) -> pb.BatchedTensor:
    bt = pb.BatchedTensor(dtype=pb_dtype)
    flat = [np.ascontiguousarray(a, dtype=dtype).reshape(-1) for a in arrays]
    sizes = np.array([0] + [a.nbytes for a in flat], dtype=np.int64)
    bt.offsets = np.cumsum(sizes).astype(np.int64).tobytes()
    bt.data = b"".join(a.tobytes() for a in flat)
    return bt


def encode_forward_backward_output(outputs: list[dict[str, np.ndarray]], metrics: dict[str, float]) -> bytes:
    """A ``ForwardBackwardOutput``: one ArrayRecord with every datum's float32 fields (``logprobs``, ...)."""
    msg = pb.ForwardBackwardOutput(loss_fn_output_type="ArrayRecord")
    for k, v in metrics.items():
        msg.metrics[k] = float(v)
    record = msg.loss_fn_outputs.add()
    record.type_tag = "ArrayRecord"
    record.num_datums = len(outputs)
    for name in (outputs[0].keys() if outputs else ()):
        record.fields[name].CopyFrom(_batched([o[name] for o in outputs], np.float32, pb.DTYPE_FLOAT32))
    return msg.SerializeToString()


@dataclass(frozen=True)
class SampledOut:
    tokens: list[int]
    logprobs: list[float]
    stop_reason: str  # "stop" | "length"


def encode_sample_response(sequences: list[SampledOut], prompt_logprobs: list[float] | None) -> bytes:
    """A ``SampleResponse``; prompt logprobs carry NaN where there is none (the first token)."""
    msg = pb.SampleResponse()
    for s in sequences:
        seq = msg.sequences.add()
        seq.stop_reason = pb.STOP_REASON_STOP if s.stop_reason == "stop" else pb.STOP_REASON_LENGTH
        seq.tokens = np.asarray(s.tokens, dtype=np.int32).tobytes()
        seq.logprobs = np.asarray(s.logprobs, dtype=np.float32).tobytes()
    if prompt_logprobs is not None:
        msg.prompt_logprobs = np.asarray([math.nan if x is None else x for x in prompt_logprobs],
                                         dtype=np.float32).tobytes()
    return msg.SerializeToString()
