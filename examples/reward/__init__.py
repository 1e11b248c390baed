"""Example reward configs and reward functions (importable as ``examples.reward.<module>``)."""
