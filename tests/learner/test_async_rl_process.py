"""The off-policy toolbox in a real learner process (its own process, real Redis, real torch; the rollout fleet
is the test's stand-in): each policy loss, correction, overlong mode, dynamic sampling and token-budget
micro-batches selected from the config file, trained to the end of a run (issue 14)."""

import asyncio
import math
import time

import pytest

from services.learner.observability import read_history
from tests.learner.fake_rollout import FakeFleet
from tests.learner.test_process import ENV, status, write_config
from tests.procs import spawn, stop, wait_http_ok

pytestmark = pytest.mark.process  # the learner as a process

N_PROMPTS = 12
CONFIGS = {
    "gspo+geo_seq+soft_penalty+dynamic_sampling+token_budget": {
        "algorithm": {"name": "grpo", "policy_loss": {"kind": "gspo"}, "correction": {"kind": "geo_seq"},
                      "overlong": {"kind": "soft_penalty", "budget": 4, "buffer": 2},
                      "dynamic_sampling": {"enabled": True}},
        "train": {"groups_per_step": 2, "micro_batch_size": 8, "micro_batch_tokens": 24, "torch_threads": 1}},
    "cispo+icepop+mask": {
        "algorithm": {"name": "grpo", "policy_loss": {"kind": "cispo"}, "correction": {"kind": "icepop"},
                      "overlong": {"kind": "mask"}}},
    "dppo+mis_sequence": {
        "algorithm": {"name": "grpo", "policy_loss": {"kind": "dppo"}, "correction": {"kind": "mis", "level": "sequence"}}},
    "dr_grpo+mis_token": {
        "algorithm": {"name": "grpo", "norm_std": False, "policy_loss": {"kind": "dr_grpo", "normalizer": 8},
                      "correction": {"kind": "mis", "level": "token", "low": 0.1, "high": 10.0}}},
}


@pytest.mark.parametrize("name", sorted(CONFIGS))
async def test_a_run_trains_to_the_end_with_the_configured_loss_and_correction(name, tmp_path, tiny_model_dir,
                                                                                redis_server, redis_client):
    cfg, url = write_config(tmp_path, tiny_model_dir, redis_server.url, n_prompts=N_PROMPTS, **CONFIGS[name])
    fleet = FakeFleet(redis_client, "proc", flat_keys={"e0-1", "e0-4"}, cut_keys={"e0-0", "e0-2", "e0-3"},
                      span_keys={"e0-5", "e0-6", "e0-7"})
    fleet_task = asyncio.create_task(fleet.run_forever())
    log = tmp_path / "learner.log"
    proc = spawn(["-m", "services.learner", "--config", str(cfg)], log, {**ENV, "FLEETRL_LEARNER_EXIT_WHEN_DONE": "false"})
    try:
        await asyncio.to_thread(wait_http_ok, f"{url}/health", proc, 90, log)
        deadline = time.monotonic() + 300  # ~15 s on a quiet machine; generous for a loaded one
        while True:
            st = await asyncio.to_thread(status, url)
            if st["phase"] in ("finished", "failed") or time.monotonic() > deadline:
                break
            await asyncio.sleep(0.1)
        assert st["phase"] == "finished", (st, log.read_text()[-3000:])
    finally:
        await fleet.stop(fleet_task)
        stop(proc)
    rows = list(read_history(tmp_path / "run" / "metrics.jsonl").values())
    assert all(math.isfinite(v) for r in rows for v in r.values() if isinstance(v, float)), rows
    for key in ("is_weight_mean", "is_rejected_frac", "is_capped_frac", "mismatch_k3", "mismatch_abs_mean",
                "truncated_frac", "version_span_max"):
        assert key in rows[-1], key
    c = st["counters"]
    filtering = CONFIGS[name]["algorithm"].get("dynamic_sampling", {}).get("enabled", False)
    assert c["groups_filtered"] == (2 if filtering else 0)
    assert c["samples_trained"] == 4 * (N_PROMPTS - (2 if filtering else 0))
    assert max(r["truncated_frac"] for r in rows) > 0  # the cut samples reached the loss's overlong handling
    # samples generated across a weight switch: their span is counted, and staleness is their oldest token's
    assert st["version_span_histogram"].get("1", 0) > 0
