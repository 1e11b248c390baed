"""Leave a service's process as soon as it has shut down in order, without the interpreter's teardown.

A Python process that imported torch, transformers and a service spends seconds after its last statement
freeing its modules and objects one by one (the learner: 2.5 s at load 5, 5.2-5.9 s at load 9-12; the
launcher of ``fleetrl run``: 0.7 s), none of which holds anything that outlives the process: every file,
connection, child process and embedded server a service owns is closed by its own shutdown (the lifespan's
``stop``, the entry point's ``finally``) before its entry point returns. :func:`run_main` runs an entry point
and then does what the interpreter's exit does *except* that teardown:

1. joins the threads that are not daemons (``threading._shutdown``: the executors' workers included),
2. runs the ``atexit`` handlers (logging flushes and closes its handlers, multiprocessing reaps its children,
   ``weakref.finalize`` objects, wandb's),
3. flushes ``sys.stdout`` and ``sys.stderr`` (a service's log),
4. ends with ``os._exit`` and the exit status ``python -m`` would have had: ``SystemExit``'s code (None 0, an
   int itself, anything else printed and 1), 1 after an uncaught exception's traceback, and death by SIGINT
   after an uncaught ``KeyboardInterrupt`` (as CPython does). A service that ends by a signal (uvicorn
   re-raises SIGTERM once it has shut down) never gets here: the signal ends it, as before.

Only a process's ``__main__`` calls it (``python -m services.<name>``, also when forked from the zygote);
code that imports a service's ``cli`` module, tests with their CLI runners included, is not affected.
"""

from __future__ import annotations

import atexit
import os
import signal
import sys
import threading
from collections.abc import Callable
from typing import NoReturn


def exit_status(exc: SystemExit) -> int:
    """The status ``python`` exits with for an uncaught ``exc`` (printing a non-int code, as it does)."""
    code = exc.code
    if code is None:
        return 0
    if isinstance(code, int):
        return code
    try:
        sys.stderr.write(f"{code}\n")
    except (OSError, ValueError):
        pass
    return 1


def finish() -> None:
    """The interpreter's exit up to its teardown: non-daemon threads joined, atexit handlers run, stdio flushed."""
    shutdown = getattr(threading, "_shutdown", None)  # what Py_FinalizeEx calls first (CPython 3.8-3.13)
    if shutdown is not None:
        shutdown()
    atexit._run_exitfuncs()
    for stream in (sys.stdout, sys.stderr, sys.__stdout__, sys.__stderr__):
        try:
            if stream is not None:
                stream.flush()
        except (OSError, ValueError):  # closed, or its pipe is gone: nothing more can reach it
            pass


def leave(status: int) -> NoReturn:
    """:func:`finish`, then end the process at once with ``status``."""
    finish()
    os._exit(status & 0xFF)  # what exit(3) keeps of it


def run_main(main: Callable[[], object]) -> NoReturn:
    """Run a process's entry point, then :func:`leave` with the status ``python`` would have exited with."""
    try:
        main()
    except SystemExit as exc:
        status = exit_status(exc)
    except KeyboardInterrupt:
        sys.excepthook(*sys.exc_info())
        finish()
        signal.signal(signal.SIGINT, signal.SIG_DFL)  # CPython ends an uncaught Ctrl-C by the signal itself
        os.kill(os.getpid(), signal.SIGINT)
        os._exit(130)  # not reached where SIGINT can be delivered
    except BaseException:  # noqa: BLE001  (the traceback, then status 1: what the interpreter does)
        sys.excepthook(*sys.exc_info())
        status = 1
    else:
        status = 0
    leave(status)
