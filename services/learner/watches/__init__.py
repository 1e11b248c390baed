"""What the run owner watches beside its own loop: the rollout fleet, the elastic pool, Redis, dead letters."""
