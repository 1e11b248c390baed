"""Groups are issued by the learner: what it trains on answers prompts it issued, at the size and positions it
issued them.

Each prompt task the learner produces carries a *grant*: an HMAC of its group id and group size under a key only
the learner holds (``RunState.grant_key``, saved with its checkpoints). Rollout workers copy the task's grant into
every experience of the group (and an orchestrator that opens sessions for a task passes it to ``POST
/sessions``); nothing else can make one. An experience is filed only if its group is an attempt the learner issued
for a position still in flight, its ``group_size`` is the issued one, its id is the sample id of its position, and
it bears that group's grant — so a short "group" made up for an in-flight position (a session opened with a
chosen ``group_id``, an entry written to Redis) never completes first and is never trained.
"""

from __future__ import annotations

import hashlib
import hmac
from collections.abc import Mapping

from services.learner.data import parse_item_id
from services.learner.run_state import InFlight
from shared.schemas import Experience, sample_id


def grant(key: str, group_id: str, group_size: int) -> str:
    """The grant of group ``group_id`` of ``group_size`` samples under the learner's ``key``."""
    return hmac.new(key.encode(), f"{group_id}\x00{group_size}".encode(), hashlib.sha256).hexdigest()[:40]


def unissued(e: Experience, in_flight: Mapping[str, InFlight], key: str, default_size: int) -> str | None:
    """Why ``e`` does not answer a group this learner issued, or None when it does (or when its position is not
    in flight at all: then it is a duplicate of a finished position, which the group buffer counts as such)."""
    parsed = parse_item_id(e.group_id)
    if parsed is None:
        return f"group {e.group_id!r} is no prompt this learner issued"
    position, attempt = parsed
    item = in_flight.get(position)
    if item is None:
        return None
    if attempt > item.attempt:
        return f"group {e.group_id!r}: attempt {attempt} of {position} was never issued (latest {item.attempt})"
    size = item.group_size or default_size
    if e.group_size != size:
        return f"group {e.group_id!r} was issued with {size} samples, the experience says {e.group_size}"
    base = sample_id(e.group_id, e.index)
    if e.prompt_id != e.group_id or (e.id != base and not e.id.startswith(base + "~")):
        return f"sample {e.id!r} (prompt {e.prompt_id!r}) is not position {e.index} of group {e.group_id!r}"
    if e.grant is None:
        return f"group {e.group_id!r}: the experience bears no grant (not made from the task the learner issued)"
    if not hmac.compare_digest(e.grant, grant(key, e.group_id, size)):
        return f"group {e.group_id!r}: the experience's grant is not the one the learner issued"
    return None
