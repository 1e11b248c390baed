"""Imported by ``fleetrl plugins --import tests.deploy.cli_teardown_probe`` in tests/deploy/test_cli_exit.py: a module
global whose finalizer runs only in the interpreter's teardown of modules, marking the file named by
``FLEETRL_TEST_TEARDOWN_MARK``."""

import os
from pathlib import Path


class TornDown:
    def __del__(self) -> None:
        Path(os.environ["FLEETRL_TEST_TEARDOWN_MARK"]).write_text("torn down")


KEPT = TornDown()
