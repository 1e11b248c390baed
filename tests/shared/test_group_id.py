"""Group ids: one parser and one formatter, round-tripping every id the learner issues."""

from __future__ import annotations

import pytest

from shared.group_id import GroupId


@pytest.mark.parametrize(("text", "gid"), [
    ("e0-7", GroupId(0, 7)), ("e12-7-r2", GroupId(12, 7, 2)), ("e3-0-r1#5", GroupId(3, 0, 1)),
])
def test_parse_and_format_round_trip(text, gid):
    assert GroupId.parse(text) == gid
    assert str(gid) == text.split("#")[0] and GroupId.parse(str(gid)) == gid


@pytest.mark.parametrize("foreign", ["", "x0-1", "e-1", "e1-", "e1-2-3", "e1-2-rx", "e01-2-r", "session-abc", "e1-2-r3-r4"])
def test_foreign_ids_are_not_ours(foreign):
    assert GroupId.parse(foreign) is None


def test_position_and_retry():
    g = GroupId(2, 9)
    assert g.position == "e2-9" and str(g.retry(3)) == "e2-9-r3" and g.retry(3).position == g.position
    assert sorted([GroupId(1, 2, 1), GroupId(1, 2), GroupId(0, 9)]) == [GroupId(0, 9), GroupId(1, 2), GroupId(1, 2, 1)]
