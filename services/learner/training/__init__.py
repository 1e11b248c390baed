"""The torch side of the learner: models, batches, optimizer backends, RL / SFT trainers, checkpoints."""
