"""The FastAPI app factory: routers, request ids, error mapping."""

from __future__ import annotations

import logging
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager

from fastapi import FastAPI, Request, Response
from fastapi.responses import JSONResponse

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
    app.middleware("http")(_request_id)
    app.add_exception_handler(NanofleetError, _nanofleet_error)  # type: ignore[arg-type]
    return app


async def _request_id(request: Request, call_next: Callable[[Request], Awaitable[Response]]) -> Response:
    rid = request.headers.get("x-request-id") or new_request_id()
    token = request_id_var.set(rid[:64])
    started = time.perf_counter()
    try:
        response = await call_next(request)
    finally:
        request_id_var.reset(token)
    response.headers["x-request-id"] = rid[:64]
    if request.url.path not in ("/healthz", "/readyz"):
        log.info("%s %s %d %.1fms", request.method, request.url.path, response.status_code,
                 (time.perf_counter() - started) * 1000)
    return response


async def _nanofleet_error(request: Request, err: NanofleetError) -> JSONResponse:
    return JSONResponse({"detail": err.message, **err.data}, status_code=err.status_code)


def factory() -> FastAPI:
    """For `uvicorn --factory gateway.app:factory`: settings from the environment, logging set up."""
    settings = get_settings()
    configure_logging(level=settings.log_level, json=settings.log_json, secrets=settings.secrets())
    return create_app(settings)
