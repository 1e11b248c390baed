"""The rollout service's side of weight sync: the sidecar that brings this replica's engine to each
version the learner publishes (``sidecar.py``), its settings (the rollout settings' ``weights`` section),
the receiving half of the protocol (``receiver.py``, ``loader.py``, ``snapshot.py``) and the engines' sinks."""
