"""Liveness and readiness."""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter
from fastapi.responses import JSONResponse

from gateway.deps import StateDep
from shared.migrate import schema_problem

router = APIRouter(tags=["health"])
NOT_READY = {"description": "a dependency is down, or the database is not migrated; `failing` names it"}


@router.get("/healthz")
def healthz() -> dict[str, str]:
    """The process is alive."""
    return {"status": "ok"}


@router.get("/readyz", responses={503: NOT_READY})
def readyz(state: StateDep) -> JSONResponse:
    """Database (at this code's revision), Redis and at least one worker answer."""
    checks: dict[str, Any] = {}
    try:
        # read on every call, not cached: a newer nanofleet may migrate the database under this one
        checks["database"] = schema_problem(state.settings.database_url) or "ok"
    except Exception as err:
        checks["database"] = f"down: {type(err).__name__}"
    try:
        state.redis.ping()
        checks["redis"] = "ok"
        count = state.workers.count()
        checks["workers"] = count or ("none answering" if count == 0 else "unknown (a check is under way)")
    except Exception as err:
        checks.setdefault("redis", f"down: {type(err).__name__}")
        checks["workers"] = "unknown (redis down)"
    failing = [k for k, v in checks.items() if not (v == "ok" or isinstance(v, int))]
    body = {"status": "ready" if not failing else "not ready", "checks": checks, "failing": failing}
    return JSONResponse(body, status_code=503 if failing else 200)

