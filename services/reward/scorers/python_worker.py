"""A worker process of a python scorer: loads the operator's function once, then scores chunks it is sent.

    python -m services.reward.scorers.python_worker      (started by ``WorkerPool``, never by hand)

Frames (``frames.py``: length-prefixed JSON, no pickle) both ways on the worker's stdin / stdout. The first frame names the function and the scorer's settings
(``{"config": ..., "sys_path": [...]}``) and is answered ``{"ready": true}`` or ``{"error": ...}``; each later
frame ``{"items": [...], "offset": k}`` is answered ``{"values": [...]}`` or ``{"error": ...}``. The
function's own prints go to stderr (the service's log), so they cannot corrupt a frame. The worker ends at
end of input, and with the service (Linux: the parent-death signal).
"""

from __future__ import annotations

import os
import signal
import sys
from typing import Any

from services.reward.scorers.frames import encode_frame, read_frame


def _die_with_parent() -> None:
    """Linux: SIGKILL this worker when the reward service dies (a killed service leaves no workers behind)."""
    if sys.platform.startswith("linux"):
        try:
            import ctypes

            ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG
        except (OSError, AttributeError):
            pass
        if os.getppid() == 1:
            os._exit(0)


def main() -> None:
    _die_with_parent()
    out = os.fdopen(os.dup(1), "wb")  # the frames' channel; fd 1 (prints of the function) goes to stderr
    os.dup2(2, 1)
    sys.stdout = sys.stderr
    inp = sys.stdin.buffer
    hello = read_frame(inp)
    if hello is None:
        return
    for entry in reversed(hello.get("sys_path", [])):
        if entry not in sys.path:
            sys.path.insert(0, entry)

    from services.reward.errors import ScorerFailure
    from services.reward.scorer_config import PythonScorerConfig
    from services.reward.scorers.python_fn import SIGNATURES, load_function
    from shared.reward_api import ScoreItem
    from shared.service_kit.loader import LoadError

    config = PythonScorerConfig.model_validate(hello["config"])
    signature = SIGNATURES[config.signature]
    try:
        fn = load_function(config.function, signature.protocol, config.sys_path)
    except LoadError as exc:
        out.write(encode_frame({"error": str(exc)}))
        out.flush()
        return
    out.write(encode_frame({"ready": True}))
    out.flush()
    while (request := read_frame(inp)) is not None:
        try:
            items = [ScoreItem.model_validate(i) for i in request["items"]]
            reply: dict[str, Any] = {"values": signature.run(fn, config, items, request.get("offset", 0))}
        except ScorerFailure as exc:
            reply = {"error": exc.message, "retryable": exc.retryable}  # (a result of the wrong kind: not retried)
        except Exception as exc:  # noqa: BLE001 - the user function's failure, reported to the service
            reply = {"error": f"{type(exc).__name__}: {exc}"}
        out.write(encode_frame(reply))
        out.flush()


if __name__ == "__main__":
    main()
