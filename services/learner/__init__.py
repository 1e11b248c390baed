"""FleetRL learner service: consumes experiences, trains (PPO, GRPO, REINFORCE++, RLOO, SFT), publishes weights."""
