"""Rollout functions over the worker's contract beyond ``single_turn``: ``multi_turn`` (environments and tools:
tool calls parsed from the model's text, executed with a timeout, their results appended as chat-template
deltas) and ``openai_agent`` (your agent program per sample, its calls recorded through a session)."""
