"""Delta or full per round (services/learner/weights/chooser.py), from hand-given round times: the faster kind,
a probe of the other every ``probe_every`` rounds, a switch when the timings flip; ``on`` and ``off`` ignore them."""

from __future__ import annotations

import pytest

from services.learner.weights.chooser import RoundChooser

MB = 1 << 20


def run(chooser: RoundChooser, seconds: dict[str, float], rounds: int, nbytes: int = 200 * MB) -> list[str]:
    """``rounds`` rounds, each of the kind chosen, taking ``seconds[kind]``; the kinds, in order."""
    kinds = []
    for _ in range(rounds):
        kind = chooser.choose().kind
        kinds.append(kind)
        chooser.record(kind, seconds[kind], nbytes)
    return kinds


def test_first_a_delta_probe_after_the_full_first_round_then_the_faster_kind():
    c = RoundChooser("auto", probe_every=5)
    assert c.choose().kind == "delta" and c.choose().reason == "first"  # nothing measured: probe a delta round
    c.record("full", 0.30, 200 * MB)  # a publisher's first round is full
    assert (c.choose().kind, c.choose().reason) == ("delta", "first")
    c.record("delta", 0.10, 200 * MB)
    choice = c.choose()
    assert (choice.kind, choice.reason) == ("delta", "faster")
    assert choice.full_s == pytest.approx(0.30) and choice.delta_s == pytest.approx(0.10)
    fresh = RoundChooser("auto")
    fresh.record("delta", 0.1, MB)
    assert (fresh.choose().kind, fresh.choose().reason) == ("full", "first")  # a full round measured next


def test_a_slow_link_chooses_delta_and_probes_full_every_n_rounds():
    c = RoundChooser("auto", probe_every=5)
    c.record("full", 3.3, 200 * MB)  # 1 Gb/s: a full round 3.3 s, a delta round 0.5 s
    kinds = run(c, {"full": 3.3, "delta": 0.5}, 15)
    # delta (first), then 4 delta rounds in a row and a full probe as every 5th: the full probe after 4 delta rounds
    assert kinds == ["delta"] * 4 + ["full"] + ["delta"] * 4 + ["full"] + ["delta"] * 4 + ["full"], kinds


def test_a_fast_link_chooses_full_and_probes_delta():
    c = RoundChooser("auto", probe_every=4)
    kinds = run(c, {"full": 0.3, "delta": 0.45}, 12)
    # nothing measured: a delta round first, then a full one (a publisher's first round is full anyway)
    assert kinds[:2] == ["delta", "full"], kinds
    assert kinds[2:] == ["full", "full", "delta", "full", "full", "full", "delta", "full", "full", "full"], kinds
    assert c.choose().reason in ("faster", "probe")


def test_it_adapts_when_the_timings_flip():
    c = RoundChooser("auto", probe_every=4)
    c.record("full", 0.3, 200 * MB)
    run(c, {"full": 0.3, "delta": 0.45}, 8)  # loopback: full wins
    assert c.choose().kind == "full" or c.choose().reason == "probe"
    # the link slows (the learner now publishes across hosts): the delta probe due now (0.5 s) still loses to the
    # full estimate of the fast link; the next full round shows the change (3.3 s), and delta wins from then on, bar
    # a full probe every 4th round
    kinds = run(c, {"full": 3.3, "delta": 0.5}, 12)
    assert "".join(k[0] for k in kinds) == "dfdddfdddfdd", kinds
    # the learning rate rises (every value moves: a delta round now costs more than a full one): the delta estimate,
    # an average of consecutive rounds, passes the full one by the margin after four slow rounds (a full probe among
    # them); then full rounds
    kinds = run(c, {"full": 3.3, "delta": 4.0}, 8)
    assert "".join(k[0] for k in kinds) == "dfdddfff", kinds


def test_an_estimate_is_an_average_of_consecutive_rounds_and_a_probe_replaces_a_stale_one():
    c = RoundChooser("auto", probe_every=3)
    c.record("full", 1.0, MB)
    c.record("full", 2.0, MB)
    assert c.estimate("full") == pytest.approx(1.5)  # consecutive: averaged (weight 0.5 on the newest)
    c.record("delta", 0.5, MB)
    c.record("delta", 0.5, MB)
    c.record("full", 4.0, MB)  # two rounds since the last full one (probe_every - 1): the old estimate is stale
    assert c.estimate("full") == pytest.approx(4.0)


def test_estimates_are_per_byte_of_the_version():
    c = RoundChooser("auto")
    c.record("full", 1.0, 100 * MB)
    c.record("delta", 0.5, 100 * MB)
    c.record("delta", 1.0, 200 * MB)  # the model grew (a new layout): same seconds per byte
    assert c.estimate("delta") == pytest.approx(1.0) and c.estimate("full") == pytest.approx(2.0)


@pytest.mark.parametrize(("mode", "kind"), [("on", "delta"), ("off", "full")])
def test_on_and_off_ignore_the_timings(mode, kind):
    c = RoundChooser(mode, probe_every=2)
    slow = {"full": 0.1, "delta": 5.0} if kind == "delta" else {"full": 5.0, "delta": 0.1}
    assert run(c, slow, 6) == [kind] * 6
    assert c.choose().reason == "setting"


def test_probe_every_below_two_is_refused():
    with pytest.raises(ValueError, match="probe_every"):
        RoundChooser("auto", probe_every=1)


def test_near_a_tie_the_kind_in_use_stays():
    c = RoundChooser("auto", probe_every=3)
    c.record("full", 1.0, MB)
    c.record("delta", 0.95, MB)  # 5 % faster: delta is taken (nothing was in use yet)
    assert c.choose().kind == "delta"
    kinds = run(c, {"full": 0.92, "delta": 0.95}, 6, MB)  # full now 3 % faster: within the margin, delta stays
    assert kinds == ["delta", "full", "delta", "delta", "full", "delta"], kinds  # (and a full probe every 3rd)
    kinds = run(c, {"full": 0.80, "delta": 0.95}, 3, MB)  # full 16 % faster: it takes over at its next probe
    assert kinds[-1] == "full" and c.faster == "full", kinds
