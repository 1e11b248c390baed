"""Importing this starts a thread (tests/deploy/test_zygote.py: a zygote that has threads must not fork)."""

import threading

threading.Thread(target=threading.Event().wait, daemon=True).start()
