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


def test_each_kind_runs_twice_before_its_estimate_counts_then_the_faster_kind():
    c = RoundChooser("auto", probe_every=5)
    assert (c.choose().kind, c.choose().reason) == ("full", "warm-up")  # a publisher's first round is full anyway
    c.record("full", 0.30, 200 * MB)
    assert (c.choose().kind, c.choose().reason) == ("full", "warm-up")
    c.record("full", 0.20, 200 * MB)
    assert c.estimate("full") == pytest.approx(0.20)  # the second round replaces the cold first one
    assert (c.choose().kind, c.choose().reason) == ("delta", "warm-up")
    c.record("delta", 0.15, 200 * MB)
    assert (c.choose().kind, c.choose().reason) == ("delta", "warm-up")
    c.record("delta", 0.10, 200 * MB)
    choice = c.choose()
    assert (choice.kind, choice.reason) == ("delta", "faster")
    assert choice.full_s == pytest.approx(0.20) and choice.delta_s == pytest.approx(0.10)


def test_a_cold_first_full_round_does_not_make_slower_delta_rounds_look_faster():
    """benchmarks/weight_delta.py on a quiet loopback: a full round 0.31 s first, 0.19-0.20 s after; delta rounds
    0.24-0.30 s. Trusting the first full round, auto chose delta every round (1.25-1.55x a full one)."""
    c = RoundChooser("auto", probe_every=20)
    times = iter([0.31] + [0.195] * 50)
    kinds = []
    for _ in range(12):
        kind = c.choose().kind
        kinds.append(kind)
        c.record(kind, next(times) if kind == "full" else 0.25, 200 * MB)
    assert kinds[:4] == ["full", "full", "delta", "delta"] and kinds[4:] == ["full"] * 8, kinds


def test_a_slow_link_chooses_delta_and_probes_full_every_n_rounds():
    c = RoundChooser("auto", probe_every=5)
    c.record("full", 3.3, 200 * MB)  # 1 Gb/s: a full round 3.3 s, a delta round 0.5 s
    kinds = run(c, {"full": 3.3, "delta": 0.5}, 16)
    # a second full round and two delta rounds (the warm-up), then delta with a full probe as every 5th round
    assert kinds == ["full", "delta", "delta", "delta", "delta", "full"] + ["delta"] * 4 + ["full"] + \
        ["delta"] * 4 + ["full"], kinds


def test_a_fast_link_chooses_full_and_probes_delta():
    c = RoundChooser("auto", probe_every=4)
    kinds = run(c, {"full": 0.3, "delta": 0.45}, 12)
    # the warm-up (two of each, full first), then full with a delta probe as every 4th round
    assert kinds[:4] == ["full", "full", "delta", "delta"], kinds
    assert kinds[4:] == ["full", "full", "full", "delta", "full", "full", "full", "delta"], kinds
    assert c.choose().reason in ("faster", "probe")


def test_it_adapts_when_the_timings_flip():
    c = RoundChooser("auto", probe_every=4)
    c.record("full", 0.3, 200 * MB)
    run(c, {"full": 0.3, "delta": 0.45}, 8)  # loopback: full wins
    assert c.choose().kind == "full" or c.choose().reason == "probe"
    # the link slows (the learner now publishes across hosts): the next full round shows it (3.3 s), and delta wins
    # from then on, bar a full probe every 4th round
    kinds = run(c, {"full": 3.3, "delta": 0.5}, 12)
    assert "".join(k[0] for k in kinds) == "fdddfdddfddd", kinds
    # the learning rate rises (every value moves: a delta round now costs more than a full one): the delta estimate,
    # an average of consecutive rounds, passes the full one by the margin after four slow rounds (a full probe among
    # them); then full rounds
    kinds = run(c, {"full": 3.3, "delta": 4.0}, 8)
    assert "".join(k[0] for k in kinds) == "fdddfdff", kinds


def test_an_estimate_is_an_average_of_consecutive_rounds_and_a_probe_replaces_a_stale_one():
    c = RoundChooser("auto", probe_every=3)
    c.record("full", 9.0, MB)  # the warm-up: replaced by the next
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
    for kind, seconds in (("full", 1.0), ("delta", 0.95), ("full", 1.0), ("delta", 0.95)):  # the warm-up
        c.record(kind, seconds, MB)  # delta 5 % faster: taken (nothing was in use yet)
    assert c.choose().kind == "delta"
    kinds = run(c, {"full": 0.92, "delta": 0.95}, 6, MB)  # full now 3 % faster: within the margin, delta stays
    assert kinds == ["delta", "full", "delta", "delta", "full", "delta"], kinds  # (and a full probe every 3rd)
    kinds = run(c, {"full": 0.80, "delta": 0.95}, 3, MB)  # full 16 % faster: it takes over at its next probe
    assert kinds[-1] == "full" and c.faster == "full", kinds
