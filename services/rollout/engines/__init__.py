"""Generation engines behind one interface (:class:`services.rollout.engines.base.Engine`)."""

from services.rollout.engines.base import Engine, create_engine, engine_class, register_engine

__all__ = ["Engine", "create_engine", "engine_class", "register_engine"]
