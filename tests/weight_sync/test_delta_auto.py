"""``delta: auto`` in one process: a real publisher and real sidecars (as in test_delta_inprocess.py) choose delta or
full per round from the round times they measure. The learner's end of the link is rate-limited for real (each
broadcast's wait is held until its bytes could have crossed a link of the given rate): on a slow link auto chooses
delta rounds; on a fast link with a slow compare (the learner's compare on a loaded core, emulated by a pause per
piece) it chooses full rounds and probes delta; back on the slow link it returns to delta. Every replica is
bit-equal to the learner's wire weights after every round, across each switch."""

from __future__ import annotations

import logging
import time
from typing import Any

from services.learner.weights import WeightPublisher
from services.learner.weights import collective as C
from services.learner.weights import delta as learner_delta
from shared.weight_sync import WeightSyncSettings
from shared.weight_sync.status import weight_sync_status
from tests.weight_sync.conftest import wait_alive
from tests.weight_sync.test_delta_inprocess import FAST, assert_bit_equal, make_model, nudge, start_replica

PROBE_EVERY = 4


class Link:
    """The learner's end of a link of ``rate`` bytes a second to every member (None: no limit): broadcasts cross it
    one after another, and waiting for one returns once its bytes could have crossed."""

    def __init__(self, rate: float | None) -> None:
        self.rate, self.free_at = rate, 0.0

    def wrap(self, group: Any) -> Any:
        link = self

        class Limited:
            def __getattr__(self, name: str) -> Any:
                return getattr(group, name)

            def __setattr__(self, name: str, value: Any) -> None:
                setattr(group, name, value)  # (group.broken = True)

            def broadcast(self, tensor: Any, src: int = 0) -> Any:
                due = 0.0
                if link.rate is not None:
                    link.free_at = max(time.monotonic(), link.free_at) + tensor.numel() * tensor.element_size() / link.rate
                    due = link.free_at
                return group.broadcast(tensor, src), due

            def wait(self, ticket: Any, timeout_s: float | None = None, cancel: Any = None) -> None:
                work, due = ticket
                group.wait(work, timeout_s, cancel)
                time.sleep(max(0.0, due - time.monotonic()))

        return Limited()


async def test_auto_chooses_delta_on_a_slow_link_and_full_on_a_fast_one(redis_client, threads, monkeypatch, caplog):
    caplog.set_level(logging.INFO, logger="services.learner.weights.publisher")
    link = Link(rate=250e3)  # 250 kB/s: a full round of the ~130 kB model about 0.5 s, a delta round a tenth of it
    real_open = C.open_group
    monkeypatch.setattr(C, "open_group", lambda *a, **kw: link.wrap(real_open(*a, **kw)))
    real_patch, compare_pause = learner_delta.make_patch, [0.0]

    def slow_patch(*a: Any) -> Any:
        time.sleep(compare_pause[0])
        return real_patch(*a)

    monkeypatch.setattr(learner_delta, "make_patch", slow_patch)
    run = "delta-auto"
    a, b = await start_replica(redis_client, run, "a"), await start_replica(redis_client, run, "b")
    model = make_model()
    settings = WeightSyncSettings(bucket_bytes=16 << 10, **{**FAST, "delta": "auto"}, delta_probe_every=PROBE_EVERY)
    seen: list[str] = []
    try:
        async with WeightPublisher(redis_client, run, settings) as pub:
            await wait_alive(pub, 2)

            async def publish(step: int) -> str:
                nudge(model, step)
                v = await pub.publish(model)
                r = pub.last_report
                assert len(r.loaded) == 2 and not r.errors and len(r.round_bytes) == 1, r
                assert_bit_equal(model, [a, b])  # after every round, whichever kind
                kind = next(iter(r.round_bytes))
                assert kind == r.delta_choice["kind"], r  # what was chosen is what went
                if pub.delta.chooser.choose().kind == "full":
                    # the next round is full (it wins, or is a probe): the base was not advanced (no copy)
                    assert pub.delta.version < v and pub.delta.last_advance_s == 0.0, (pub.delta.version, v)
                else:
                    assert pub.delta.version == v  # the next round is a delta round: the base is current
                seen.append(kind[0])
                return kind

            # a slow link: the warm-up (two full rounds, two delta rounds), then delta wins (a full probe every 4th)
            for step in range(8):
                await publish(step)
            assert "".join(seen) == "ffdddfdd", seen
            r = pub.last_report
            assert r.delta_choice["reason"] == "faster" and r.delta_choice["delta_s"] < r.delta_choice["full_s"], r
            choice = (await weight_sync_status(redis_client, run))["delta_choice"]
            assert choice["kind"] == "delta" and choice["version"] == r.version

            # a fast link, and the learner's compare slow: full rounds win once a full probe measures the link
            link.rate, compare_pause[0] = None, 0.05
            del seen[:]
            for step in range(8, 24):  # (slack: the switch comes at the first full probe, within 4 rounds)
                await publish(step)
            tail = "".join(seen[-PROBE_EVERY * 2:])
            assert tail.count("d") == 2 and tail.count("f") == 6 and "dd" not in tail, seen  # full, delta probes
            r = pub.last_report
            assert r.delta_choice["full_s"] < r.delta_choice["delta_s"], r

            # back to the slow link and a quick compare: the next delta probe wins, and delta stays (bar full probes)
            link.rate, compare_pause[0] = 250e3, 0.0
            del seen[:]
            for step in range(24, 36):
                await publish(step)
            tail = "".join(seen[-PROBE_EVERY * 2:])
            assert tail.count("f") == 2 and tail.count("d") == 6 and "ff" not in tail, seen  # delta, full probes
        said = [m.getMessage() for m in caplog.records if m.getMessage().startswith("delta auto:")]
        # once per change of preference, not per round: delta (first), delta -> full, full -> delta, each once
        assert [m.split()[2] for m in said] == ["delta", "full", "delta"], said
    finally:
        for sc in (a, b):
            await sc.stop()


async def test_a_refused_delta_round_counts_with_its_resend_and_auto_falls_back_to_full(redis_client, threads,
                                                                                         monkeypatch):
    # every patch corrupted (its digest then differs): each delta round is refused and the version resent whole in the
    # same publish. That pair is what a delta round costs here, so auto measures it as one (slower than a full round)
    # and goes back to full rounds, probing delta now and then; not a delta attempt (and a resend) every round
    from services.learner.weights.collective import patch_tensor as real
    from shared.weight_sync.delta import HEADER

    def corrupt(data: Any, backend: str) -> Any:
        t = real(data, backend)
        if t.numel() > HEADER.size + 8:
            t[-2:] ^= 0xFF
        return t

    monkeypatch.setattr(C, "patch_tensor", corrupt)
    real_patch = learner_delta.make_patch

    def slow_patch(*a: Any) -> Any:  # a compare that takes a while: the delta round's cost is not lost in the noise
        time.sleep(0.05)
        return real_patch(*a)

    monkeypatch.setattr(learner_delta, "make_patch", slow_patch)
    run = "delta-auto-refused"
    a = await start_replica(redis_client, run, "a")
    model = make_model()
    settings = WeightSyncSettings(bucket_bytes=16 << 10, **{**FAST, "delta": "auto"}, delta_probe_every=PROBE_EVERY)
    try:
        async with WeightPublisher(redis_client, run, settings) as pub:
            await wait_alive(pub, 1)
            seen = []
            for step in range(7):
                nudge(model, step)
                await pub.publish(model)
                r = pub.last_report
                assert r.loaded == [a.replica_id] and not r.refused, r
                assert_bit_equal(model, [a])
                seen.append("+".join(sorted(r.round_bytes)))
            # v1, v2 full (the warm-up); v3, v4 the delta warm-up, refused and resent whole; then full (a delta probe
            # would come at v8)
            assert seen == ["full", "full", "delta+full", "delta+full", "full", "full", "full"], seen
            est = pub.delta.chooser
            assert est.estimate("delta") > est.estimate("full")
    finally:
        await a.stop()
