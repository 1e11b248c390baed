"""Imported by nothing: a test checks that a prompt task naming ``tests.rollout.agents.canary:X`` does not import it."""

raise AssertionError("tests.rollout.agents.canary was imported: a task's metadata reached an importer")
