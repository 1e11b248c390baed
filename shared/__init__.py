"""FleetRL contracts shared by every service: wire schemas, the queue, settings, telemetry.

Nothing service-specific lives here, and nothing here imports a service. Modules that need torch
(``weight_sync``) import it lazily so the contracts stay importable without it. Tooling (the tiny local
models, the embedded Redis) lives in ``deploy/local/``.
"""

__version__ = "0.1.0"
