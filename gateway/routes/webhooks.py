"""Chat platform webhooks: POST /webhooks/<platform> (and GET /webhooks/whatsapp for Meta's handshake).

The pipeline: read the raw body (413 over 1 MB) -> verify the signature (401, nothing stored) ->
parse (400 when malformed; unknown events 200 and ignored) -> in one transaction, in the
threadpool: ledger, allow_from, conversation, submit -> commit -> enqueue -> answer (a challenge,
a Discord PONG or deferred response, or {"ok": true}). The answer waits for the commit, as platforms
send an unanswered event again; Discord, which never does and fails an interaction unanswered after
3 s, is answered by its deadline while the ingest goes on. Sent messages the platform reports as not
delivered (WhatsApp's failed statuses) are dead-lettered on the way."""

from __future__ import annotations

import asyncio
import functools
import logging
from typing import Any

import anyio
import anyio.to_thread
from fastapi import APIRouter, HTTPException, Request
from fastapi.responses import JSONResponse, PlainTextResponse, Response
from starlette.requests import ClientDisconnect

from gateway.deps import StateDep
from gateway.state import AppState
from shared.channels import REGISTRY, delivery
from shared.channels.base import BaseChannel, Channel, Parsed, WebhookError
from shared.channels.inbound import Ingested, ingest
from shared.channels.whatsapp import WhatsAppChannel
from shared.contracts import InboundMessage

log = logging.getLogger(__name__)
router = APIRouter(prefix="/webhooks", tags=["webhooks"])
MAX_BODY = 1024 * 1024
INGEST_THREADS = 4
# Bodies over this are verified and parsed in a thread: some platforms' checks read the JSON first (Feishu's
# verification token), and a 1 MB body nobody signed would hold the event loop, and every stream on it, ~15 ms.
INLINE_BODY = 64 * 1024
# Running ingests with a deadline: asyncio holds tasks only weakly, and one may outlive its request.
_INGESTS: set[asyncio.Task[Ingested]] = set()
RESPONSES: dict[int | str, dict[str, Any]] = {
    401: {"description": "bad or stale signature; nothing was stored"},
    400: {"description": "malformed body"},
    404: {"description": "the platform is not configured"},
    413: {"description": "body over 1 MB"},
    503: {"description": "the platform must be asked something first and did not answer (Telegram's getMe); "
                         "nothing was stored: the platform sends the event again"},
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


async def read_body(request: Request) -> bytes:
    length = request.headers.get("content-length", "")
    if length.isdigit() and int(length) > MAX_BODY:
        raise HTTPException(413, "body over 1 MB")
    buf = bytearray()
    try:
        async for part in request.stream():
            buf += part
            if len(buf) > MAX_BODY:
                raise HTTPException(413, "body over 1 MB")
    except ClientDisconnect:
        raise HTTPException(400, "client went away before sending the whole body") from None
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


@functools.cache
def _ingest_limiter() -> anyio.CapacityLimiter:
    """Ingests at once per process. More threads only wait on each other for the GIL (each one
    is mostly Python work between short queries), which stretches every request's latency."""
    return anyio.CapacityLimiter(INGEST_THREADS)


def _ingest(state: AppState, ch: Channel, messages: list[InboundMessage]) -> Ingested:
    out = ingest(state.runtime, ch, messages)
    state.dispatch(out.nexts)
    return out


async def _ingest_within(state: AppState, ch: Channel, messages: list[InboundMessage]) -> Ingested | None:
    """Ingest `messages`; None when the channel's ack deadline comes first. The ingest is not cancelled
    then: it runs to its end in its own task (a thread cannot be stopped anyway), so the message is stored
    and processed once, only after the platform has its answer."""
    work = anyio.to_thread.run_sync(_ingest, state, ch, messages, limiter=_ingest_limiter())
    if ch.ack_deadline is None:
        return await work
    task = asyncio.create_task(work)
    _INGESTS.add(task)
    task.add_done_callback(_INGESTS.discard)
    try:
        done, _ = await asyncio.wait({task}, timeout=ch.ack_deadline)
    except asyncio.CancelledError:  # the request went (the client left): the ingest goes on without it
        task.add_done_callback(_failed_late)
        raise
    if not done:
        log.warning("%s: the webhook is answered before its message is stored (over %ss)", ch.name, ch.ack_deadline)
        task.add_done_callback(_failed_late)
        return None
    return task.result()


async def drain(timeout: float) -> None:
    """At shutdown, before the connections close: wait up to `timeout` seconds for the ingests that
    outlived their requests, or their messages would be lost with the process."""
    if _INGESTS:
        log.info("waiting for %d webhook ingest(s) answered before they were stored", len(_INGESTS))
        _, left = await asyncio.wait(set(_INGESTS), timeout=timeout)
        if left:
            log.error("%d webhook message(s) answered but not stored after %ss are lost with this process "
                      "(their platform does not send them again)", len(left), timeout)


def _failed_late(task: asyncio.Task[Ingested]) -> None:
    """An ingest that outlived its request has no one to raise to: log its failure."""
    if not task.cancelled() and (err := task.exception()) is not None:
        log.error("an ingest finished after its webhook was answered, and failed", exc_info=err)


async def receive(name: str, request: Request, state: AppState) -> Response:
    ch = channel(state, name)
    body = await read_body(request)
    verified = functools.partial(_verified, ch, dict(request.headers), body)
    try:  # on the event loop, unless parsing may wait on the platform (getMe, once) or the body is large
        off_loop = ch.parse_may_call_out() or len(body) > INLINE_BODY
        parsed = await anyio.to_thread.run_sync(verified) if off_loop else verified()
    except WebhookError as err:
        return JSONResponse({"detail": err.message}, status_code=err.status_code)
    if parsed.undelivered:
        await anyio.to_thread.run_sync(delivery.undelivered, state.runtime, ch.name, parsed.undelivered,
                                       limiter=_ingest_limiter())
    if not parsed.messages:
        return JSONResponse(parsed.response or {"ok": True})
    out = await _ingest_within(state, ch, parsed.messages)
    if out is None:  # still storing: who is denied is known already (allow_from is a setting)
        denied = not any(ch.allowed(m.sender_id) for m in parsed.messages)
    else:
        denied = bool(out.denied and not out.accepted)
    if denied and parsed.denied_response is not None:
        return JSONResponse(parsed.denied_response)
    return JSONResponse(parsed.response or {"ok": True})


def _endpoint(name: str) -> Any:
    async def endpoint(request: Request, state: StateDep) -> Response:
        return await receive(name, request, state)

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
