"""The FastAPI app factory: routers, request ids, error mapping."""

from __future__ import annotations

import logging
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from gateway.routes import conversations, cron, health, outbox, runs, skills, subagents, tools, webhooks
from gateway.state import AppState
from shared.errors import NanofleetError
from shared.logs import configure_logging, new_request_id, request_id_var
from shared.settings import Settings, get_settings

log = logging.getLogger("gateway")


def create_app(settings: Settings | None = None) -> FastAPI:
    settings = settings or get_settings()

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        state: AppState = app.state.nanofleet
        yield
        await state.aredis.aclose()
        state.redis.close()

    app = FastAPI(title="nanofleet", version="0.1.0", lifespan=lifespan,
                  description="A self-hosted AI agent runtime: REST API, webhooks and event streams.")
    app.state.nanofleet = AppState.build(settings)
    for module in (health, conversations, runs, subagents, cron, tools, skills, outbox, webhooks):
        app.include_router(module.router)
    app.add_middleware(RequestIds)
    app.add_exception_handler(NanofleetError, _nanofleet_error)  # type: ignore[arg-type]
    return app


class RequestIds:
    """Pure ASGI middleware (Starlette's BaseHTTPMiddleware costs a task and a stream per request):
    a request id from `x-request-id` or a new one, set for logs and Celery headers, echoed back,
    and one access log line per request."""

    QUIET = ("/healthz", "/readyz")

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        given = next((v for k, v in scope["headers"] if k == b"x-request-id"), b"").decode("latin-1")
        rid = (given or new_request_id())[:64]
        token = request_id_var.set(rid)
        started = time.perf_counter()
        status = 500

        async def send_with_id(message: Message) -> None:
            nonlocal status
            if message["type"] == "http.response.start":
                status = message["status"]
                message["headers"] = [*message.get("headers", []), (b"x-request-id", rid.encode("latin-1"))]
            await send(message)

        try:
            await self.app(scope, receive, send_with_id)
        finally:
            request_id_var.reset(token)
            if scope["path"] not in self.QUIET:
                log.info("%s %s %d %.1fms", scope["method"], scope["path"], status,
                         (time.perf_counter() - started) * 1000)


async def _nanofleet_error(request: Request, err: NanofleetError) -> JSONResponse:
    return JSONResponse({"detail": err.message, **err.data}, status_code=err.status_code)


def factory() -> FastAPI:
    """For `uvicorn --factory gateway.app:factory`: settings from the environment, logging set up."""
    settings = get_settings()
    configure_logging(level=settings.log_level, json=settings.log_json, secrets=settings.secrets())
    return create_app(settings)
