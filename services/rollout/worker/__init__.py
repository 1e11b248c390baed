"""The rollout worker: prompts stream -> n samples per prompt -> reward service -> experiences stream."""
