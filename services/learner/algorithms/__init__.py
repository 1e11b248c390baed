"""RL algorithms as small pure functions over tensors, plus the registry that names them.

Modules: ``masked`` (masked reductions), ``advantages`` (GAE, group / RLOO baselines, returns),
``kl`` (k1/k2/k3 estimators), ``losses`` (clipped surrogate, value loss, entropy, aggregation,
truncated IS), ``normalize`` (running reward statistics), ``config`` (typed settings, torch-free),
``registry`` (algorithm name -> class).
"""
