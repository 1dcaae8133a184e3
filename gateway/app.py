"""The FastAPI app factory: routers, request ids, API keys and body size, error mapping."""

from __future__ import annotations

import asyncio
import json
import logging
import re
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

import redis
from fastapi import FastAPI, HTTPException, Request
from fastapi.encoders import jsonable_encoder
from fastapi.exception_handlers import http_exception_handler
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, Response
from fastapi_offline import FastAPIOffline
from starlette.datastructures import Headers
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from gateway.deps import bearer_token, database_unavailable, key_refusal, redis_unavailable
from gateway.routes import conversations, cron, files, health, outbox, runs, skills, subagents, tools, web, webhooks
from gateway.schemas import MAX_BODY, MAX_BODY_WITHOUT_IMAGES
from gateway.state import AppState
from shared import db, startup_checks
from shared.errors import NanofleetError
from shared.logs import configure_logging, new_request_id, request_id_var
from shared.process_guard import guard_or_warn
from shared.settings import Settings, get_settings
from shared.tools import mcp

log = logging.getLogger("gateway")
ECHO_CHARS = 100  # of a string input a 422 quotes back
DOCS_ASSETS = "/docs/static"  # Swagger UI's and ReDoc's scripts, styles and icon
WEBHOOK_LINE_EVERY = 1.0  # seconds: a platform's answered webhooks get at most one access line this often
LATE_RECORDS = 10.0  # seconds shutdown waits for webhook events still to record (some answered already: Discord's)


def create_app(settings: Settings | None = None) -> FastAPI:
    settings = settings or get_settings()
    db.configure(settings.database, role="gateway")

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        state: AppState = app.state.nanofleet
        yield
        try:
            await state.ledger.drain(timeout=LATE_RECORDS)
            await state.aredis.aclose()
            state.redis.close()
        finally:
            # The runtime's MCP servers: a stdio one that does not exit when its stdin closes would outlive
            # the gateway. In a thread: the sessions run on the process's background loop, not this one.
            await asyncio.to_thread(mcp.shutdown)

    # /docs and /redoc with their scripts and styles served from here (fastapi-offline ships them):
    # FastAPI's own pages load them from a CDN, which an air-gapped host cannot reach.
    app = FastAPIOffline(title="nanofleet", version="0.1.0", lifespan=lifespan, static_url=DOCS_ASSETS,
                         description="A self-hosted AI agent runtime: REST API, webhooks and event streams.")
    app.state.nanofleet = AppState.build(settings)
    startup_checks.warn_gateway(settings)
    # webhooks first: a request is matched against the routes in order, and they come the most often
    for module in (webhooks, health, conversations, runs, subagents, cron, tools, skills, outbox, files, web):
        app.include_router(module.router)
    app.add_middleware(ApiGate, settings=settings)
    app.add_middleware(webhooks.FastPath, state=app.state.nanofleet)  # webhooks skip FastAPI's routing
    app.add_middleware(RequestIds)  # added last, so outermost: every answer has an id and a log line
    app.add_exception_handler(NanofleetError, _nanofleet_error)  # type: ignore[arg-type]
    app.add_exception_handler(RequestValidationError, _invalid)  # type: ignore[arg-type]
    app.add_exception_handler(StarletteHTTPException, _http_error)  # type: ignore[arg-type]
    app.add_exception_handler(redis.ConnectionError, _redis_unavailable)  # type: ignore[arg-type]
    app.add_exception_handler(redis.TimeoutError, _redis_not_answering)  # type: ignore[arg-type]
    for unreachable in db.UNAVAILABLE:
        app.add_exception_handler(unreachable, _database_unavailable)
    return app


class RequestIds:
    """Pure ASGI middleware (Starlette's BaseHTTPMiddleware costs a task and a stream per request):
    a request id from `x-request-id` or a new one, set for logs and Celery headers, echoed back,
    and one access log line per request. A platform's answered webhooks get at most one line a
    second, which counts the others (at DEBUG): a busy bot's thousands a second would be most of
    the gateway's work and of its log, and say nothing the count does not."""

    QUIET = ("/healthz", "/readyz")

    def __init__(self, app: ASGIApp) -> None:
        self.app = app
        self.webhook_lines: dict[str, tuple[float, int]] = {}  # platform: when its last line went out, answers since

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
            if scope["path"] not in self.QUIET:  # before the reset: the line carries the request id
                self._log(scope, status, (time.perf_counter() - started) * 1000)
            request_id_var.reset(token)

    def _log(self, scope: Scope, status: int, ms: float) -> None:
        platform = webhooks.platform_of(scope) if status < 400 else None
        if platform is None:
            log.info("%s %s %d %.1fms", scope["method"], scope["path"], status, ms)
            return
        now = time.monotonic()
        last, since = self.webhook_lines.get(platform, (-WEBHOOK_LINE_EVERY, 0))
        if now - last < WEBHOOK_LINE_EVERY:
            self.webhook_lines[platform] = (last, since + 1)
            log.debug("%s %s %d %.1fms", scope["method"], scope["path"], status, ms)
            return
        self.webhook_lines[platform] = (now, 0)
        log.info("%s %s %d %.1fms%s", scope["method"], scope["path"], status, ms,
                 f" (and {since} more answered since the last line)" if since else "")


class ApiGate:
    """Pure ASGI middleware for /api/v1: a 401 without a valid bearer key, and a 413 for a body over
    its route's limit (`body_limit`), both before anything reads the body. FastAPI reads and parses
    the body before it runs dependencies, so `require_key` alone would let anyone make the gateway
    take in a large upload first. `require_key` stays on the routers (it shows the security scheme in
    the OpenAPI schema) and checks with the same function. The webhooks read their raw body
    themselves, with their own limit."""

    PREFIX = "/api/v1/"
    # The routes whose body is ChatIn, which takes photos (tests/gateway/test_body_limits.py checks the list)
    WITH_IMAGES = re.compile(r"/api/v1/conversations/[^/]+/(?:chat|messages)")

    def __init__(self, app: ASGIApp, settings: Settings) -> None:
        self.app = app
        self.settings = settings

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        path = scope.get("path", "").removeprefix(scope.get("root_path", ""))  # as routing sees it, behind a proxy too
        if scope["type"] != "http" or not path.startswith(self.PREFIX):
            await self.app(scope, receive, send)
            return
        headers = Headers(scope=scope)
        refusal = key_refusal(self.settings, bearer_token(headers.get("authorization")))
        if refusal is not None:
            await JSONResponse({"detail": refusal}, 401, {"WWW-Authenticate": "Bearer"})(scope, receive, send)
        elif _declared_length(headers) > (limit := self.body_limit(scope["method"], path)):
            await JSONResponse({"detail": TooLarge.detail_for(limit)}, 413)(scope, receive, send)
        else:
            await self.app(scope, _limited(receive, limit), send)

    @classmethod
    def body_limit(cls, method: str, path: str) -> int:
        """The most a request's body may hold: MAX_BODY for a message with photos, 8 MiB for the rest
        (a large body is taken in whole before it is parsed; only photos make one large)."""
        return MAX_BODY if method == "POST" and cls.WITH_IMAGES.fullmatch(path) else MAX_BODY_WITHOUT_IMAGES


class TooLarge(HTTPException):
    """A streamed body (no Content-Length) grew past its route's limit while the route read it;
    FastAPI passes an HTTPException from reading the body on to the handler that answers it."""

    def __init__(self, limit: int) -> None:
        super().__init__(413, self.detail_for(limit))

    @staticmethod
    def detail_for(limit: int) -> str:
        """The refusal's words, the limit exact (in MiB as the docs give it, and in bytes)."""
        return f"the body is over {limit / 2**20:g} MiB ({limit:,} bytes)"


def _declared_length(headers: Headers) -> int:
    """The Content-Length; 0 if there is none or it is not a plain number (the count of what arrives holds)."""
    value = headers.get("content-length", "")
    return int(value) if value.isascii() and value.isdigit() and len(value) < 19 else 0


def _limited(receive: Receive, limit: int) -> Receive:
    """`receive`, refusing a body once more than `limit` bytes of it have arrived."""
    read = 0

    async def receive_limited() -> Message:
        nonlocal read
        message = await receive()
        read += len(message.get("body", b""))
        if read > limit:
            raise TooLarge(limit)
        return message

    return receive_limited


class AsciiJSONResponse(JSONResponse):
    """JSON with every non-ASCII character escaped: a lone surrogate (which JSON may spell, Python
    keeps, and UTF-8 cannot encode) is written as \\udXXX instead of failing the response."""

    def render(self, content: Any) -> bytes:
        return json.dumps(content, ensure_ascii=True, allow_nan=False, separators=(",", ":")).encode("ascii")


UNREADABLE = "There was an error parsing the body"  # FastAPI's 400 for a body json.loads raised on


async def _http_error(request: Request, err: StarletteHTTPException) -> Response:
    """FastAPI's answer, with what was wrong when it could not read a JSON body at all."""
    if err.status_code == 400 and err.detail == UNREADABLE and err.__cause__ is not None:
        err = StarletteHTTPException(400, _unreadable(err.__cause__))
    return await http_exception_handler(request, err)


def _unreadable(cause: BaseException) -> str:
    if isinstance(cause, RecursionError):
        return "the JSON body nests arrays or objects too deep to read"
    if isinstance(cause, UnicodeDecodeError):
        return "the body is not UTF-8: send JSON in UTF-8"
    if isinstance(cause, ValueError) and "digits" in str(cause):
        return "a number in the JSON body has too many digits to read (at most 4,300)"
    return f"the JSON body could not be read ({type(cause).__name__})"


async def _invalid(request: Request, err: RequestValidationError) -> JSONResponse:
    """FastAPI's 422, quoting at most a short scalar of the input (its default quotes all of it, a
    whole body included, and fails with a 500 on what JSON cannot hold). A body sent as anything but
    JSON (curl -d sends a form) is told so: FastAPI's own words are about a dictionary."""
    kind = request.headers.get("content-type", "").split(";")[0].strip().lower()
    errors = [_quoted(e) for e in err.errors()]
    if kind != "application/json" and not kind.endswith("+json"):
        for error in errors:
            if tuple(error.get("loc", ())) == ("body",):
                error["msg"] = f"send the body as JSON, with Content-Type: application/json (not '{kind or 'none'}')"
    return AsciiJSONResponse({"detail": jsonable_encoder(errors)}, status_code=422)


def _quoted(error: dict[str, Any]) -> dict[str, Any]:
    out = {k: v for k, v in error.items() if k != "input"}
    value = error.get("input")
    if isinstance(value, str):
        out["input"] = value[:ECHO_CHARS] + ("..." if len(value) > ECHO_CHARS else "")
    elif value is None or (isinstance(value, int | float) and abs(value) < 2**64):  # NaN, Infinity: not JSON
        out["input"] = value
    return out


async def _nanofleet_error(request: Request, err: NanofleetError) -> JSONResponse:
    return JSONResponse({"detail": err.message, **err.data}, status_code=err.status_code)


async def _redis_unavailable(request: Request, err: redis.ConnectionError) -> JSONResponse:
    return redis_unavailable(err)


async def _redis_not_answering(request: Request, err: redis.TimeoutError) -> JSONResponse:
    """Redis took connections but gave no answer in time (not a ConnectionError in redis-py): a 503
    as for one that refuses them."""
    return JSONResponse({"detail": "Redis is not answering; try again shortly"}, status_code=503,
                        headers={"Retry-After": "5"})


async def _database_unavailable(request: Request, err: Exception) -> JSONResponse:
    return database_unavailable(err)


def factory() -> FastAPI:
    """For `uvicorn --factory gateway.app:factory`: settings from the environment, logging set up.
    Made non-dumpable first: `nanofleet gateway` already is, but uvicorn starts each of several
    workers as a new program (the flag does not survive exec), and uvicorn may be run directly."""
    guard_or_warn("the gateway")
    settings = get_settings()
    configure_logging(level=settings.log_level, json=settings.log_json, secrets=settings.secrets())
    return create_app(settings)
