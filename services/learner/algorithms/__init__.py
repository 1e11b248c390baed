"""RL algorithms as small pure functions over tensors, plus the registries that name them.

Functions (torch): ``masked`` (masked reductions), ``advantages`` (GAE, group / RLOO baselines, returns),
``kl`` (k1/k2/k3 estimators), ``losses`` (clipped surrogate, value loss, entropy, aggregation, the policy
loss output type), ``policy_losses`` (ppo, dr_grpo, gspo, cispo, dppo and custom losses by
``policy_loss.kind``), ``corrections`` (off-policy corrections between engine and learner: tis, mis,
geo_seq, icepop, none), ``length_shaping`` (what happens to truncated samples), ``normalize`` (running reward statistics),
``registry`` (algorithm name -> class), ``preference_losses`` (Bradley-Terry, DPO sigmoid / cDPO / IPO, TRL-named
metrics), ``pair_selection`` (what online DPO and rejection sampling take from a group).

Settings (torch-free): ``config`` (the algorithm union on ``name``), ``loss_config`` (``policy_loss``),
``offpolicy_config`` (``correction``).
"""
