"""The Tinker API on FleetRL: a learner mode that serves ``tinker`` client programs (see docs/tinker.md)."""
