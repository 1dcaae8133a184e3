"""Request dependencies: settings, the runtime, sessions, the producer, bearer-key auth."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Annotated

from fastapi import Depends, HTTPException, Request, status
from fastapi.security import HTTPAuthorizationCredentials, HTTPBearer
from sqlmodel import Session

from gateway.state import AppState
from shared.agent.runtime import Runtime
from shared.channels.signing import same
from shared.db import get_engine
from shared.settings import Settings

bearer = HTTPBearer(auto_error=False)


def app_state(request: Request) -> AppState:
    state: AppState = request.app.state.nanofleet
    return state


def settings_dep(state: Annotated[AppState, Depends(app_state)]) -> Settings:
    return state.settings


def runtime_dep(state: Annotated[AppState, Depends(app_state)]) -> Runtime:
    return state.runtime


def session_dep(state: Annotated[AppState, Depends(app_state)]) -> Iterator[Session]:
    with Session(get_engine(state.settings.database_url), expire_on_commit=False) as s:
        yield s


def require_key(
    state: Annotated[AppState, Depends(app_state)],
    creds: Annotated[HTTPAuthorizationCredentials | None, Depends(bearer)],
) -> None:
    """Bearer API keys; with none configured the API is closed."""
    keys = [k.get_secret_value() for k in state.settings.api_keys]
    given = creds.credentials if creds else ""
    # `same` compares UTF-8 bytes: compare_digest on str raises for non-ASCII, a 500 instead of a 401
    if not keys or not any(same(given, k) for k in keys):
        raise HTTPException(
            status.HTTP_401_UNAUTHORIZED,
            "missing or invalid API key" if keys else "no API keys configured (set NANOFLEET_API_KEYS)",
            headers={"WWW-Authenticate": "Bearer"},
        )


SettingsDep = Annotated[Settings, Depends(settings_dep)]
RuntimeDep = Annotated[Runtime, Depends(runtime_dep)]
SessionDep = Annotated[Session, Depends(session_dep)]
StateDep = Annotated[AppState, Depends(app_state)]
