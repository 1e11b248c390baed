"""The arithmetic behind docs/scale.md: learner memory per GPU for 7B / 32B / 70B policies under FSDP2 and ZeRO-3
on 8, 16 and 64 H100s, rollout replicas, and the weight publish time. Nothing here is measured: every figure is
bytes per parameter times parameters, divided as the sharding divides it. ``python benchmarks/scale_arithmetic.py``
prints the tables docs/scale.md shows (GB = 1e9 bytes)."""

from __future__ import annotations

from dataclasses import dataclass

GB = 1e9
H100_GB = 85.5  # 81,559 MiB as nvidia-smi shows an H100 SXM 80GB
TOKENS = 8192  # tokens per micro-batch per GPU (e.g. 4 sequences of 2,048): train.micro_batch_tokens
PUBLISH_BUCKET = 256 * 2**20  # publish.sync.bucket_bytes default


@dataclass(frozen=True)
class Model:
    name: str
    params: float  # all parameters
    hidden: int
    layers: int
    ffn: int
    vocab: int
    tied: bool

    @property
    def embed(self) -> float:
        return self.vocab * self.hidden * (1 if self.tied else 2)

    @property
    def per_layer(self) -> float:
        return (self.params - self.embed) / self.layers


MODELS = [  # the public configs' shapes (config.json of each)
    Model("7B (Qwen2.5-7B)", 7.62e9, 3584, 28, 18944, 152064, False),
    Model("32B (Qwen2.5-32B)", 32.76e9, 5120, 64, 27648, 152064, False),
    Model("70B (Llama-3.1-70B)", 70.55e9, 8192, 80, 28672, 128256, False),
]
GPUS = [8, 16, 64]

# bytes per parameter of the sharded model states (divided by the ranks)
POLICY = {
    # bf16 compute with fp32 master weights: the sharded parameter IS the fp32 master (4), fp32 gradients reduced
    # in fp32 (4), Adam m and v (4 + 4); the bf16 copy exists only while a unit is all-gathered
    "FSDP2": 4 + 4 + 8,
    # bf16 parameter partition (2) and gradient partition (2), fp32 master (4), Adam m and v (8): ZeRO paper's 16
    "ZeRO-3": 2 + 2 + 4 + 8,
}
REFERENCE = 2  # forward only: bf16 parameters, sharded the same way
CRITIC = 16  # trained like the policy (same trunk, a value head)


def unsharded_peak(m: Model, backend: str) -> float:
    """Bytes a rank holds unsharded at once: FSDP2 gathers a decoder layer in bf16 while prefetching the next and
    reduce-scatters the previous one's bf16 gradient (3 layers' worth), or the root unit (embeddings, lm_head)
    when larger; ZeRO-3 gathers up to its prefetch bucket and live-parameter limit (about the same, 2 layers)."""
    layers = (3 if backend == "FSDP2" else 2) * m.per_layer * 2
    return max(layers, m.embed * 2)


def activations(m: Model) -> tuple[float, float, float]:
    """Activation checkpointing per decoder layer: the layer inputs kept (L x T x h x 2 B), one layer's
    recomputation working set (~ T x (4h + 3 ffn) x 2 B) and the logits (T x V x (2 B bf16 + 4 B fp32
    log-softmax), their gradient as large again)."""
    kept = m.layers * TOKENS * m.hidden * 2
    working = TOKENS * (4 * m.hidden + 3 * m.ffn) * 2
    logits = TOKENS * m.vocab * (2 + 4) * 2
    return kept, working, logits


def learner_table() -> list[str]:
    rows = ["| policy | backend | algorithm | states / GPU at 8 | at 16 | at 64 | + gathered | + activations | fits 8 / 16 / 64 |",
            "|---|---|---|---|---|---|---|---|---|"]
    for m in MODELS:
        act = sum(activations(m))
        for backend, per in POLICY.items():
            for algo, extra in (("GRPO (policy + reference)", REFERENCE), ("PPO (+ critic)", REFERENCE + CRITIC)):
                total = m.params * (per + extra)
                states = [total / n / GB for n in GPUS]
                gathered = unsharded_peak(m, backend) / GB * (2 if "critic" in algo else 1)
                fits = " / ".join("yes" if s + gathered + act / GB < H100_GB * 0.9 else "no" for s in states)
                rows.append(f"| {m.name} | {backend} | {algo} | {states[0]:.1f} GB | {states[1]:.1f} GB | "
                            f"{states[2]:.1f} GB | {gathered:.1f} GB | {act / GB:.1f} GB | {fits} |")
    return rows


def activation_rows() -> list[str]:
    rows = ["| policy | layer inputs kept | one layer recomputed | logits + their gradient | total |", "|---|---|---|---|---|"]
    for m in MODELS:
        kept, working, logits = activations(m)
        rows.append(f"| {m.name} | {kept / GB:.2f} GB | {working / GB:.2f} GB | {logits / GB:.2f} GB | "
                    f"{(kept + working + logits) / GB:.2f} GB |")
    return rows


def publish_rows() -> list[str]:
    links = [("NVLink 4 (450 GB/s a direction)", 450), ("InfiniBand NDR 400 Gb/s (50 GB/s)", 50),
             ("RoCE / Ethernet 100 Gb/s (12.5 GB/s)", 12.5)]
    rows = ["| policy | bf16 bytes | 256 MiB buckets | " + " | ".join(name for name, _ in links) + " |",
            "|---|---|---|" + "---|" * len(links)]
    for m in MODELS:
        size = m.params * 2
        buckets = -(-size // PUBLISH_BUCKET)
        # the gather of bucket k+1 over the learner's ranks overlaps the broadcast of bucket k: the slower link
        # sets the pace; a pipelined broadcast costs bytes / bandwidth whatever the number of receivers
        times = [size / (bw * GB) for _, bw in links]
        rows.append(f"| {m.name} | {size / GB:.1f} GB | {int(buckets)} | " + " | ".join(f"{t:.2f} s" for t in times)
                    + " |")
    return rows


def main() -> None:
    print("\n".join(learner_table()))
    print()
    print("\n".join(activation_rows()))
    print()
    print("\n".join(publish_rows()))


if __name__ == "__main__":
    main()
