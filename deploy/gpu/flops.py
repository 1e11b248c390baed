"""Model FLOPs utilisation (MFU): the FLOPs a training step needs over what the GPU's bf16 tensor cores could do.

A trained token costs ``6 x N`` FLOPs for a model of ``N`` parameters (forward 2N, backward 4N; the PaLM
convention: the attention's own term, recomputation and the no-grad passes of an RL step are not counted, so
MFU understates the work done). The peak is the dense bf16 figure of the vendor's datasheet for the GPU's name,
or ``FLEETRL_PEAK_TFLOPS`` where set (any GPU, or to compare against a measured matmul peak).
"""

from __future__ import annotations

import os

# dense bf16 tensor-core TFLOP/s (no sparsity), SXM / PCIe as named by torch.cuda.get_device_name
PEAK_BF16_TFLOPS = [
    ("H200", 989.0), ("H100 PCIe", 756.0), ("H100", 989.0), ("GH200", 989.0), ("B200", 2250.0),
    ("A100", 312.0), ("A800", 312.0), ("L40S", 362.0), ("L40", 181.0), ("L4", 121.0),
    ("A10", 125.0), ("RTX 4090", 165.0), ("RTX 6000 Ada", 364.0),
]


def peak_flops(device_name: str) -> float | None:
    """The bf16 peak in FLOP/s for ``device_name`` (``FLEETRL_PEAK_TFLOPS`` first); None where unknown."""
    forced = os.environ.get("FLEETRL_PEAK_TFLOPS")
    if forced:
        return float(forced) * 1e12
    for key, tflops in PEAK_BF16_TFLOPS:
        if key in device_name:
            return tflops * 1e12
    return None


def mfu(params: int, tokens_per_s: float, devices: int, device_name: str) -> float | None:
    """``6 x params x tokens/s`` over ``devices`` GPUs' peak; None where the peak is unknown."""
    peak = peak_flops(device_name)
    return None if peak is None else 6.0 * params * tokens_per_s / (devices * peak)
