"""The SFT run owner: batches of (prompt, answer) pairs from the dataset, no queue."""
