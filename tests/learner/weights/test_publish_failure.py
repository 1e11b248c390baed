"""A publish that fails on the publisher's side fails that round, with its reason, never the learner: the
version is not announced, the reason is in the report and the history, and the next publish works."""

from __future__ import annotations

import pytest
import torch

from services.learner.weights import PublishFailed, WeightPublisher
from shared import keys
from shared.weight_sync import WeightSyncSettings


async def test_a_failed_snapshot_write_fails_the_round_not_the_caller(tmp_path, redis_client):
    blocker = tmp_path / "not-a-dir"
    blocker.write_text("a file where the snapshot directory should be")
    model = torch.nn.Linear(8, 8)
    settings = WeightSyncSettings(snapshot_dir=str(blocker / "snap"), bucket_bytes=1 << 10)
    async with WeightPublisher(redis_client, "pf", settings) as pub:
        with pytest.raises(PublishFailed, match="publishing version 1 failed: .*Error"):
            await pub.publish(model)
        assert await redis_client.get(keys.weights_version("pf")) is None  # never announced
        assert pub.last_report.version == 1 and pub.last_report.errors
        assert pub.history.failed_in_a_row == 1 and "publishing version 1 failed" in pub.history.last_error
        assert "the last 1 weight round" not in (await pub.lag_problem() or "")  # one failure: no alarm yet
        with pytest.raises(PublishFailed):
            await pub.publish(model)
        assert (await pub.lag_problem()).startswith("the last 2 weight rounds failed: publishing version 1 failed")
    fixed = WeightSyncSettings(snapshot_dir=str(tmp_path / "snap"), bucket_bytes=1 << 10)
    async with WeightPublisher(redis_client, "pf", fixed) as pub:
        assert await pub.publish(model) == 1
        assert pub.history.failed_in_a_row == 0 and await pub.lag_problem() is None
        assert (tmp_path / "snap" / "v0000000001").is_dir()
