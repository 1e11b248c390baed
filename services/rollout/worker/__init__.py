"""The rollout worker: prompts stream -> rollout function (``contract.py``; ``single_turn`` by default) -> reward
service -> experiences stream."""
