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
async def healthz() -> dict[str, str]:
    """The process is alive. On the event loop, not in the thread pool: readiness checks waiting on a
    database that does not answer can hold every thread of the pool, and this must still answer."""
    return {"status": "ok"}


@router.get("/readyz", responses={503: NOT_READY})
def readyz(state: StateDep) -> JSONResponse:
    """Database (at this code's revision) and Redis answer: the gateway can take messages in. How
    many workers answer is shown but does not count: a gateway taken out of a load balancer while
    every worker restarts (a deploy) would refuse webhooks it could have stored, and some platforms
    (Discord) do not send them again. `nanofleet status` fails when no worker answers."""
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
    failing = [k for k in ("database", "redis") if checks[k] != "ok"]
    body = {"status": "ready" if not failing else "not ready", "checks": checks, "failing": failing}
    return JSONResponse(body, status_code=503 if failing else 200)

