"""Chat platform webhooks: POST /webhooks/<platform> (and GET /webhooks/whatsapp for Meta's handshake).

The pipeline: read the raw body (413 over 1 MB) -> verify the signature (401, nothing stored) ->
parse (400 when malformed; unknown events 200 and ignored) -> allow_from -> record the events with
their messages in the ledger, with other requests' (gateway/ledger.py: a duplicate stops here) ->
answer (a challenge, a Discord PONG or deferred response, or {"ok": true}) while their submission
to a worker is enqueued. The answer waits for the commit, as platforms send an unanswered event again;
Discord, which never does and fails an interaction unanswered after 3 s, is answered by its deadline
while the write goes on. Sent messages the platform reports as not delivered (WhatsApp's failed
statuses) are dead-lettered on the way."""

from __future__ import annotations

import asyncio
import functools
import logging
from collections.abc import Callable
from typing import Any

import anyio
import anyio.to_thread
import redis
from fastapi import APIRouter, HTTPException, Request
from fastapi.responses import JSONResponse, PlainTextResponse, Response
from starlette.types import ASGIApp, Receive, Scope, Send

from gateway.deps import StateDep, app_state, database_unavailable, redis_unavailable
from gateway.state import AppState
from shared.channels import REGISTRY, delivery
from shared.channels.base import BaseChannel, Channel, Parsed, WebhookError
from shared.channels.clients import MustAsk, may_ask
from shared.channels.inbound import Entry
from shared.channels.whatsapp import WhatsAppChannel
from shared.db import unavailable

log = logging.getLogger(__name__)
router = APIRouter(prefix="/webhooks", tags=["webhooks"])
MAX_BODY = 1024 * 1024
THREADS = 4
# Bodies over this are verified and parsed in a thread: some platforms' checks read the JSON first (Feishu's
# verification token), and a 1 MB body nobody signed would hold the event loop, and every stream on it, ~15 ms.
INLINE_BODY = 64 * 1024
RESPONSES: dict[int | str, dict[str, Any]] = {
    401: {"description": "bad or stale signature; nothing was stored"},
    400: {"description": "malformed body"},
    404: {"description": "the platform is not configured"},
    413: {"description": "body over 1 MB"},
    503: {"description": "the database is unavailable, or the platform must be asked something first and did "
                         "not answer (Telegram's getMe); nothing was stored: the platform sends the event again"},
}


def channel(state: AppState, name: str) -> Channel:
    """The app's instance of a platform, built once; 404 (naming what to set) when it is off."""
    ch = state.channels.get(name)
    if ch is None:
        ch = state.channels.setdefault(name, REGISTRY[name](state.settings))
    if not ch.enabled():
        missing: list[str] = ch.missing() if isinstance(ch, BaseChannel) else []
        raise HTTPException(404, f"{name} is not configured" + (f": set {', '.join(missing)}" if missing else ""))
    return ch


async def read_body(scope: Scope, receive: Receive) -> bytes:
    """The raw body; 413 over MAX_BODY (the declared length first), 400 if the client goes away."""
    length = next((v for k, v in scope["headers"] if k == b"content-length"), b"")
    if length.isdigit() and int(length) > MAX_BODY:
        raise HTTPException(413, "body over 1 MB")
    buf = bytearray()
    while True:
        message = await receive()
        if message["type"] == "http.disconnect":
            raise HTTPException(400, "client went away before sending the whole body")
        buf += message.get("body", b"")
        if len(buf) > MAX_BODY:
            raise HTTPException(413, "body over 1 MB")
        if not message.get("more_body", False):
            return bytes(buf)


def _verified(ch: Channel, headers: dict[str, str], body: bytes) -> Parsed:
    ch.verify(headers, body)
    try:
        return ch.parse(headers, body)
    except WebhookError:
        raise
    except (AttributeError, TypeError, KeyError, ValueError, RecursionError) as err:  # signed, not a shape we know
        log.warning("%s: malformed event: %s: %s", ch.name, type(err).__name__, err)
        raise WebhookError(400, "malformed event") from None


def _on_loop(verified: Callable[[], Parsed]) -> Parsed | None:
    """`verified()`, or None when it would have to ask the platform something (it may block)."""
    token = may_ask.set(False)
    try:
        return verified()
    except MustAsk:
        return None
    finally:
        may_ask.reset(token)


@functools.cache
def _limiter() -> anyio.CapacityLimiter:
    """Threads at once per process for the rare webhook work that is not a ledger write (failed sends
    reported). More would only wait on each other for the GIL."""
    return anyio.CapacityLimiter(THREADS)


async def _record(state: AppState, ch: Channel, entries: list[Entry]) -> list[bool] | None:
    """Record `entries` (see gateway/ledger.py): per entry, whether it is new; None when the channel's
    ack deadline comes first. The write is not cancelled then: the event is recorded and its message
    submitted once, only after the platform has its answer."""
    written = state.ledger.record(entries)
    if ch.ack_deadline is None:
        return await written
    try:
        return await asyncio.wait_for(asyncio.shield(written), ch.ack_deadline)
    except TimeoutError:
        log.warning("%s: the webhook is answered before its event is recorded (over %ss)", ch.name, ch.ack_deadline)
        written.add_done_callback(_failed_late)
        return None


def _failed_late(written: asyncio.Future[list[bool]]) -> None:
    """A write that outlived its request has no one to raise to: it is logged (gateway/ledger.py)."""
    if not written.cancelled():
        written.exception()  # retrieved, so asyncio does not log it again


async def answer(state: AppState, name: str, scope: Scope, receive: Receive) -> Response:
    """The webhook's whole pipeline for one request to /webhooks/`name`."""
    ch = channel(state, name)
    body = await read_body(scope, receive)
    headers = {k.decode("latin-1"): v.decode("latin-1") for k, v in scope["headers"]}
    verified = functools.partial(_verified, ch, headers, body)
    try:  # on the event loop, unless the body is large or parsing must wait on the platform (getMe, once)
        parsed = _on_loop(verified) if len(body) <= INLINE_BODY else None
        if parsed is None:
            parsed = await anyio.to_thread.run_sync(verified)
    except WebhookError as err:
        return JSONResponse({"detail": err.message}, status_code=err.status_code)
    if parsed.undelivered:
        await anyio.to_thread.run_sync(delivery.undelivered, state.runtime, ch.name, parsed.undelivered,
                                       limiter=_limiter())
    said = [m for m in parsed.messages if not m.blank()]
    if len(said) < len(parsed.messages):  # no turn, no LLM call (a model may refuse an empty message)
        log.info("%s: %d blank message(s) ignored", ch.name, len(parsed.messages) - len(said))
    if not said:
        return JSONResponse(parsed.response or {"ok": True})
    entries = [Entry(m, ch.allowed(m.sender_id)) for m in said]
    new = await _record(state, ch, entries)
    fresh = entries if new is None else [e for e, n in zip(entries, new, strict=True) if n]
    for e in fresh:
        if not e.allowed and not e.message.follower:  # (an album item in a group, no caption: not addressed to us)
            log.info("%s: sender %s is not in allow_from; ignored", ch.name, e.message.sender_id)
    if fresh and not any(e.allowed for e in fresh) and parsed.denied_response is not None:
        return JSONResponse(parsed.denied_response)
    return JSONResponse(parsed.response or {"ok": True})


PATHS = {f"{router.prefix}/{name}": name for name in REGISTRY}


class FastPath:
    """Pure ASGI middleware that answers POST /webhooks/<platform> itself, before FastAPI routes
    anything: webhooks are most of a busy gateway's requests, and FastAPI's routing, exception
    middleware and dependency solving took more time than the pipeline. The routes below document
    them in the OpenAPI schema and answer the same way."""

    def __init__(self, app: ASGIApp, state: AppState) -> None:
        self.app = app
        self.state = state

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        name = platform_of(scope)
        if name is None:
            await self.app(scope, receive, send)
            return
        try:
            response = await answer(self.state, name, scope, receive)
        except HTTPException as err:
            response = JSONResponse({"detail": err.detail}, status_code=err.status_code, headers=err.headers)
        except redis.ConnectionError as err:
            response = redis_unavailable(err)
        except Exception as err:
            if not unavailable(err):
                raise
            response = database_unavailable(err)  # the platform sends the event again
        await response(scope, receive, send)


def platform_of(scope: Scope) -> str | None:
    """The platform of a webhook request; None for every other request."""
    if scope["type"] != "http" or scope["method"] != "POST":
        return None
    path, root = scope["path"], scope.get("root_path", "")  # the path as routing sees it, behind a proxy too
    return PATHS.get(path[len(root):] if root and path.startswith(root + "/") else path)


def _endpoint(name: str) -> Any:
    async def endpoint(request: Request) -> Response:  # FastPath answers first; this one if the router is mounted alone
        return await answer(app_state(request), name, request.scope, request.receive)

    endpoint.__name__ = f"{name}_webhook"
    endpoint.__doc__ = f"Events from {name}: verified, recorded once, answered by the agent."
    return endpoint


for _name in REGISTRY:
    router.add_api_route(f"/{_name}", _endpoint(_name), methods=["POST"], responses=RESPONSES,
                         summary=f"{_name} webhook")


@router.get("/whatsapp", response_class=PlainTextResponse,
            responses={403: {"description": "wrong hub.verify_token"}, 404: RESPONSES[404]})
def whatsapp_handshake(request: Request, state: StateDep) -> PlainTextResponse:
    """Meta's verification request: echo hub.challenge when hub.verify_token matches."""
    ch = channel(state, "whatsapp")
    challenge = ch.handshake(dict(request.query_params)) if isinstance(ch, WhatsAppChannel) else None
    if challenge is None:
        raise HTTPException(403, "verification failed")
    return PlainTextResponse(challenge)
