"""Scorer kinds: rule verifiers, Hugging Face reward models, user python functions, remote services."""
