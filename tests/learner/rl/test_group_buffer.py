"""The group buffer alone: filing, dedupe, completion, staleness by the oldest token, signal, taking a batch."""

from services.learner.rl.group_buffer import Filed, GroupBuffer, zero_variance
from shared.schemas import Experience, sample_id


def exp(gid: str, i: int, n: int = 2, reward: float = 0.0, version: int = 0, spans=None) -> Experience:
    return Experience(id=sample_id(gid, i), prompt_id=gid, group_id=gid, group_size=n, index=i,
                      prompt_token_ids=[1, 2], response_token_ids=[3, 4, 5], response_logprobs=[-1.0] * 3,
                      finish_reason="stop", reward=reward, weight_version=version, version_spans=spans)


def test_a_group_completes_when_every_index_is_filed_and_copies_are_duplicates():
    b = GroupBuffer()
    assert b.file("1-0", exp("e0-0", 0), {"e0-0"}) is Filed.HELD
    assert b.file("1-1", exp("e0-0", 0), {"e0-0"}) is Filed.DUPLICATE  # the same sample again
    assert b.file("1-2", exp("e0-1", 0), {"e0-0"}) is Filed.DUPLICATE  # its position is not in flight
    assert b.file("1-3", exp("e0-0", 1), {"e0-0"}) is Filed.COMPLETED
    assert b.complete == ["e0-0"] and [e.index for e in b.experiences("e0-0")] == [0, 1]


def test_trained_samples_stay_held_until_released_and_dropped_ones_do_not():
    b = GroupBuffer()
    for i in range(2):
        b.file(f"1-{i}", exp("e0-0", i), {"e0-0"})
        b.file(f"2-{i}", exp("e0-1", i), {"e0-1"})
    trained = b.remove("e0-0")
    assert [h.entry for h in trained] == ["1-0", "1-1"] and b.complete == ["e0-1"]
    assert b.file("3-0", exp("e0-0", 0), {"e0-0"}) is Filed.DUPLICATE  # trained, commit pending
    b.release(h.exp.id for h in trained)
    assert b.file("3-0", exp("e0-0", 0), {"e0-0"}) is Filed.HELD
    assert [h.entry for h in b.drop("e0-1")] == ["2-0", "2-1"]
    assert b.file("4-0", exp("e0-1", 0), {"e0-1"}) is Filed.HELD  # a dropped group's samples may come again


def test_staleness_is_judged_on_the_oldest_token_of_any_sample():
    b = GroupBuffer()
    b.file("1-0", exp("e0-0", 0, version=5), {"e0-0"})
    # partial rollout: tokens 0-1 from version 3, token 2 from version 5 (weight_version is the oldest span)
    b.file("1-1", exp("e0-0", 1, version=3, spans=[(0, 3), (2, 5)]), {"e0-0"})
    assert b.oldest_version("e0-0") == 3
    assert b.stale(4) == ["e0-0"] and b.stale(3) == []


def test_groups_without_signal_are_those_with_all_rewards_equal():
    assert zero_variance([1.0, 1.0, 1.0]) and zero_variance([0.5]) and not zero_variance([0.0, 1.0])
    b = GroupBuffer()
    for gid, rewards in (("e0-0", (1.0, 1.0)), ("e0-1", (0.0, 1.0)), ("e0-2", (0.0, 0.0))):
        for i, r in enumerate(rewards):
            b.file(f"{gid}:{i}", exp(gid, i, reward=r), {"e0-0", "e0-1", "e0-2"})
    assert b.without_signal() == ["e0-0", "e0-2"]


def test_a_batch_takes_one_group_per_position_and_waits_until_full_unless_the_data_is_exhausted():
    b = GroupBuffer()
    flight = {"e0-0", "e0-1", "e0-2"}
    for gid in ("e0-0", "e0-0-r1", "e0-1"):  # a late first attempt and its re-issue both complete
        for i in range(2):
            b.file(f"{gid}:{i}", exp(gid, i), flight)
    assert b.take(2, flight, exhausted=False) == ["e0-0", "e0-1"]
    assert b.take(3, flight, exhausted=False) == []  # only two positions complete
    assert b.take(3, flight, exhausted=True) == []  # e0-2 is still in flight
    assert b.take(3, {"e0-0", "e0-1"}, exhausted=True) == ["e0-0", "e0-1"]
    assert b.groups_of("e0-0") == ["e0-0", "e0-0-r1"]
