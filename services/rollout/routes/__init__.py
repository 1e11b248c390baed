"""Thin HTTP routes of the rollout service, one module per surface."""
