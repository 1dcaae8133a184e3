"""Request dependencies: settings, the runtime, sessions, the producer, bearer-key auth. Those that
never block are `async def`: FastAPI runs a plain `def` dependency in its threadpool, a thread hop per
request and dependency."""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable, Iterator
from typing import Annotated

import redis
from fastapi import Depends, HTTPException, Request, status
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from fastapi.security import HTTPAuthorizationCredentials, HTTPBearer
from fastapi.security.utils import get_authorization_scheme_param
from sqlmodel import Session

from gateway.state import AppState
from shared.agent.runtime import Runtime
from shared.channels.signing import same
from shared.db import get_engine
from shared.settings import Settings

log = logging.getLogger(__name__)
bearer = HTTPBearer(auto_error=False)


def app_state(request: Request) -> AppState:
    state: AppState = request.app.state.nanofleet
    return state


async def state_dep(request: Request) -> AppState:
    return app_state(request)


async def settings_dep(state: Annotated[AppState, Depends(state_dep)]) -> Settings:
    return state.settings


async def runtime_dep(state: Annotated[AppState, Depends(state_dep)]) -> Runtime:
    return state.runtime


def session_dep(state: Annotated[AppState, Depends(state_dep)]) -> Iterator[Session]:
    with Session(get_engine(state.settings.database_url), expire_on_commit=False) as s:
        yield s


def key_refusal(settings: Settings, token: str) -> str | None:
    """Why `token` is not a valid API key (None when it is); with no keys configured the API is closed."""
    keys = [k.get_secret_value() for k in settings.api_keys]
    if not keys:
        return "no API keys configured (set NANOFLEET_API_KEYS)"
    # `same` compares UTF-8 bytes: compare_digest on str raises for non-ASCII, a 500 instead of a 401
    return None if any(same(token, k) for k in keys) else "missing or invalid API key"


def bearer_token(authorization: str | None) -> str:
    """The token of an `Authorization: Bearer <token>` header, read the way HTTPBearer reads it; "" if none."""
    scheme, token = get_authorization_scheme_param(authorization)
    return token if scheme.lower() == "bearer" else ""


async def require_key(
    state: Annotated[AppState, Depends(state_dep)],
    creds: Annotated[HTTPAuthorizationCredentials | None, Depends(bearer)],
) -> None:
    """Bearer API keys. The gateway's ApiGate middleware (gateway/app.py) has already refused a bad key
    before the body was read; this dependency is what shows the security scheme in the OpenAPI schema
    (and holds if the routers are ever served without that middleware)."""
    refusal = key_refusal(state.settings, creds.credentials if creds else "")
    if refusal is not None:
        raise HTTPException(status.HTTP_401_UNAUTHORIZED, refusal, headers={"WWW-Authenticate": "Bearer"})


SettingsDep = Annotated[Settings, Depends(settings_dep)]
RuntimeDep = Annotated[Runtime, Depends(runtime_dep)]
SessionDep = Annotated[Session, Depends(session_dep)]
StateDep = Annotated[AppState, Depends(state_dep)]


def only_params(*known: str) -> Callable[[Request], Awaitable[None]]:
    """A dependency refusing (422) a query parameter not in `known`, or one given twice: a misspelt
    filter would silently list everything, and a repeated one is ambiguous."""

    async def check(request: Request) -> None:
        params = request.query_params
        bad = sorted(k for k in params if k not in known or len(params.getlist(k)) > 1)
        if bad:
            raise RequestValidationError([{"type": "extra_forbidden", "loc": ("query", k), "input": params[k],
                                           "msg": "unknown or repeated query parameter"} for k in bad])

    return check


def redis_unavailable(err: redis.ConnectionError) -> JSONResponse:
    """Redis down, or every connection of the gateway's pool in use (gateway/state.py): a 503 to
    try again, not a 500. After a stream has started, an error can only end it."""
    busy = isinstance(err.__cause__, TimeoutError)  # the pool's wait for a free connection ran out
    detail = ("every Redis connection is in use (too many open event streams or waiting chats)" if busy
              else "Redis is unreachable")
    return JSONResponse({"detail": f"{detail}; try again shortly"}, status_code=503, headers={"Retry-After": "5"})


def database_unavailable(err: Exception) -> JSONResponse:
    """The database unreachable, or no pooled connection free in time (shared.db.unavailable): a 503
    to try again, not a 500. The line names the error's kind only: its text may quote the statement's
    parameters, a message's words among them."""
    log.warning("the database is unavailable (%s); answered 503", type(err).__name__)
    return JSONResponse({"detail": "the database is unavailable; try again shortly"}, status_code=503,
                        headers={"Retry-After": "5"})
