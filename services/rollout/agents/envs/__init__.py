"""Environments shipped with FleetRL (by name in ``ENVIRONMENTS``): echo, calculator, reasoning_gym, openenv."""
