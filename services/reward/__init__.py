"""FleetRL reward service: reward models and verifiers, combined by configuration, behind one HTTP API."""
