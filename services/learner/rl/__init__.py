"""The RL run owner and its loop: prompts out, experiences in, complete groups to a training step, commits, publishing."""
