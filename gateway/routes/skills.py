"""The skills catalogue: built-in and workspace skills, and whether each can be used here."""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter, Depends

from gateway.deps import SettingsDep, require_key
from gateway.schemas import UNAUTHORIZED
from shared.skills import load_skills

router = APIRouter(prefix="/api/v1", tags=["skills"], dependencies=[Depends(require_key)],
                   responses=UNAUTHORIZED)


@router.get("/skills")
def list_skills(settings: SettingsDep) -> list[dict[str, Any]]:
    """Every skill with its source, the path the agent reads it at, and why it is unavailable if so."""
    return [skill.describe() for skill in load_skills(settings)]
