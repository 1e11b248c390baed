"""A process for tests/shared/test_process_exit.py: ``python -m tests.shared.exit_probe --config FILE`` (FILE: JSON
``{"dir": path, "end": "code" | "none" | "text" | "raise" | "interrupt", "code": n, "plain": bool}``).

It leaves what an orderly shutdown leaves behind: an atexit handler, a non-daemon thread still working, a log
record held in a buffering handler, text on stdout not flushed, and a module global whose finalizer runs only in
the interpreter's teardown; then it ends as ``end`` says, through ``run_main`` (or as a plain script with
``plain``)."""

import atexit
import json
import logging
import logging.handlers
import sys
import threading
import time
from pathlib import Path

from shared.service_kit.process_exit import run_main

config = json.loads(Path(sys.argv[sys.argv.index("--config") + 1]).read_text())
out = Path(config["dir"])


def mark(name: str) -> None:
    (out / name).write_text("yes")


class TornDown:
    def __del__(self) -> None:  # runs when the interpreter tears its modules down
        mark("teardown")


KEPT = TornDown()


def main() -> None:
    atexit.register(mark, "atexit")
    threading.Thread(target=lambda: (time.sleep(0.3), mark("thread")), daemon=False).start()
    log = logging.getLogger("probe")
    target = logging.FileHandler(out / "probe.log")
    log.addHandler(logging.handlers.MemoryHandler(capacity=100, flushLevel=logging.CRITICAL, target=target))
    log.warning("the last line of the log")  # held in memory until logging's shutdown flushes it
    sys.stdout.write("unflushed output")  # stdout is a file here: block-buffered
    end = config.get("end", "code")
    if end == "raise":
        raise RuntimeError("the probe failed on purpose")
    if end == "interrupt":
        raise KeyboardInterrupt
    if end == "none":
        sys.exit()
    if end == "text":
        sys.exit("a message instead of a code")
    sys.exit(config.get("code", 0))


if config.get("plain"):
    main()
else:
    run_main(main)
