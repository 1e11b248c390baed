"""The hf engine: transformers in this process with FleetRL's own continuous-batching decode loop."""
