"""The tool catalogue."""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter, Depends

from gateway.deps import RuntimeDep, require_key
from gateway.schemas import UNAUTHORIZED

router = APIRouter(prefix="/api/v1", tags=["tools"], dependencies=[Depends(require_key)], responses=UNAUTHORIZED)


@router.get("/tools")
def list_tools(rt: RuntimeDep) -> list[dict[str, Any]]:
    """Every tool with its group, schema, required permissions, and whether it may run here."""
    return rt.tools.describe()
