"""Multi-turn rollouts: tool calls parsed from the model's text, chat-template token deltas (token-in /
token-out: the model's own ids are never re-tokenised), tools executed with a timeout, environments."""
