"""``python -m services.reward``: the CLI, then the process leaves without the interpreter's teardown once the
service has shut down in order (shared/service_kit/process_exit.py)."""

from services.reward.cli import app
from shared.service_kit.process_exit import run_main

run_main(app)
