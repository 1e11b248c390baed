"""Session mode: an agent's generation calls recorded as token-exact trajectories and pushed as experiences
(see ``docs/rollout.md``, "Sessions")."""
