"""Importing this takes a minute (tests/deploy/test_zygote.py: a zygote still importing is killed on close)."""

import time

time.sleep(60)
