"""The service kit: what the rollout, reward and learner services share in how they are built.

One module per job, each importable on its own (no torch anywhere):

- :mod:`~shared.service_kit.app` — ``create_service_app``: the FastAPI app around one service object
  (``app.state.service``), its lifespan (``start()`` / ``stop()``), error handlers and middleware.
- :mod:`~shared.service_kit.errors` — the one error envelope (``ErrorResponse``), ``ServiceError`` (the base of
  every service's own errors) and the handlers that render them.
- :mod:`~shared.service_kit.validation` — the one formatter of request-validation messages.
- :mod:`~shared.service_kit.body_limit` — the one body-limit middleware (413), with a per-request hook.
- :mod:`~shared.service_kit.internal_errors` — a bug's 500 in the envelope, keeping the client's connection.
- :mod:`~shared.service_kit.auth` — the bearer-token check of control routes.
- :mod:`~shared.service_kit.deps` — the dependencies every service's ``deps.py`` builds its aliases from.
- :mod:`~shared.service_kit.openapi` — what the spec declares: error statuses, ``/metrics`` as text.
- :mod:`~shared.service_kit.loader` — ``load_object("pkg.module:attr", protocol=...)``, checked on load.
"""
