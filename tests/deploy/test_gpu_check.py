"""``make gpu-check``'s pieces that run without a GPU: the MFU arithmetic and its peak table, the learner stage's
command, the parameter count and the recipe's MFU line."""

from __future__ import annotations

from pathlib import Path

import pytest

from deploy.gpu import gpu_check
from deploy.gpu.flops import mfu, peak_flops


@pytest.mark.parametrize(("name", "tflops"), [
    ("NVIDIA H200", 989.0), ("NVIDIA H100 80GB HBM3", 989.0), ("NVIDIA H100 PCIe", 756.0),
    ("NVIDIA A100-SXM4-80GB", 312.0), ("NVIDIA A10", 125.0), ("NVIDIA L40S", 362.0), ("NVIDIA L40", 181.0),
    ("NVIDIA L4", 121.0),
])
def test_the_peak_is_the_named_gpus_not_a_prefix_of_its_name(name, tflops, monkeypatch):
    monkeypatch.delenv("FLEETRL_PEAK_TFLOPS", raising=False)
    assert peak_flops(name) == tflops * 1e12


def test_mfu_is_six_flops_a_parameter_a_token_over_the_peak_of_every_device(monkeypatch):
    monkeypatch.delenv("FLEETRL_PEAK_TFLOPS", raising=False)
    assert peak_flops("Tesla T4") is None and mfu(10**9, 1000.0, 1, "Tesla T4") is None  # no bf16 peak listed
    assert mfu(10**9, 1e5, 1, "NVIDIA A100-SXM4-80GB") == pytest.approx(6e14 / 312e12)
    assert mfu(10**9, 1e5, 2, "NVIDIA A100-SXM4-80GB") == pytest.approx(3e14 / 312e12)
    monkeypatch.setenv("FLEETRL_PEAK_TFLOPS", "100")
    assert mfu(10**9, 1e5, 1, "Tesla T4") == pytest.approx(6.0)


def test_the_learner_stage_runs_the_memory_benchmark_on_cuda_at_the_recipes_shape():
    cmd = gpu_check.learner_command()
    script = Path(cmd[1])
    assert script.is_file() and script.name == "learner_memory.py"
    assert cmd[cmd.index("--device") + 1] == "cuda"
    assert cmd[cmd.index("--hidden") + 1] == str(gpu_check.HIDDEN)
    assert cmd[cmd.index("--layers") + 1] == str(gpu_check.LAYERS)
    assert "learner" in gpu_check.STAGES


def test_the_recipes_mfu_line_counts_the_models_parameters(tiny_model_dir, monkeypatch):
    from safetensors.torch import load_file

    params = gpu_check._params(tiny_model_dir)
    assert params == sum(t.numel() for t in load_file(str(tiny_model_dir / "model.safetensors")).values())
    rows = [{"tokens": 1000, "step_time_s": 0.5}, {"tokens": 3000, "step_time_s": 1.5}]  # 2,000 tokens/s
    monkeypatch.setenv("FLEETRL_PEAK_TFLOPS", "1")
    line = gpu_check.learner_mfu(rows, params, "any GPU")
    assert f"learner MFU {6 * params * 2000 / 1e12:.1%}" in line and "2,000 tokens/s" in line
    monkeypatch.delenv("FLEETRL_PEAK_TFLOPS")
    assert "unknown peak" in gpu_check.learner_mfu(rows, params, "Tesla T4")
    assert "no tokens" in gpu_check.learner_mfu([{}], params, "NVIDIA H200")
