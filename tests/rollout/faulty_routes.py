"""A test-only extension (``extensions: ["tests.rollout.faulty_routes:faulty_router"]``): a route with a bug.

No real input produces a 500 any more, so the tests force one to check how the service answers a bug.
"""

from __future__ import annotations

from fastapi import APIRouter, Request


def faulty_router(service) -> APIRouter:
    router = APIRouter(tags=["test"])

    @router.get("/test/raise")
    async def raise_bug():
        raise RuntimeError("a bug in a route")

    @router.get("/test/connection")
    async def connection(request: Request) -> dict:
        """The client's port: the same port means the same keep-alive connection."""
        return {"client_port": request.client.port}

    return router
