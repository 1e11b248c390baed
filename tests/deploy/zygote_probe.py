"""A service stand-in for tests/deploy/test_zygote.py: ``python -m tests.deploy.zygote_probe --config FILE``
(FILE: JSON or YAML ``{"report": path, "exit": code, "raise": bool, "sleep": seconds}``) writes what its process looks like
to ``report``, then exits with ``exit`` (or raises, or sleeps first)."""

import json
import os
import sys
import threading
import time
from pathlib import Path

PRELOADED = sorted(m for m in ("decimal", "fractions") if m in sys.modules)  # before this module imports them

import yaml  # (after PRELOADED: what the zygote imported, not this module)

config = yaml.safe_load(Path(sys.argv[sys.argv.index("--config") + 1]).read_text())
with open(config["report"], "w") as out:
    json.dump({"preloaded": PRELOADED, "pid": os.getpid(), "pgid": os.getpgid(0), "sid": os.getsid(0),
               "stdin": os.readlink("/proc/self/fd/0"), "argv": sys.argv[1:], "name": __name__,
               "threads": threading.active_count(), "cwd": os.getcwd(),
               "rank_env": {k: os.environ.get(k) for k in ("RANK", "WORLD_SIZE", "MASTER_PORT")}}, out)
print("probe says hello on stdout")
print("probe says hello on stderr", file=sys.stderr)
time.sleep(config.get("sleep", 0))
if config.get("raise"):
    raise RuntimeError("probe failed on purpose")
sys.exit(config.get("exit", 0))
