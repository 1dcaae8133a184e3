"""Files the agent sent to an API conversation (the message tool's `files`), fetched by the caller."""

from __future__ import annotations

from urllib.parse import quote

from fastapi import APIRouter, Depends, HTTPException, Response
from sqlmodel import select

from gateway.deps import SessionDep, require_key
from gateway.schemas import UNAUTHORIZED, Id
from shared.models import SentFile

router = APIRouter(prefix="/api/v1/files", tags=["files"], dependencies=[Depends(require_key)],
                   responses=UNAUTHORIZED)


@router.get("/{file_id}", response_class=Response,
            responses={200: {"content": {"application/octet-stream": {}}, "description": "the file's bytes"},
                       404: {"description": "no such file (or its conversation was deleted)"}})
def get_file(file_id: Id, s: SessionDep) -> Response:
    """The file's bytes, as a download (never shown inline: a page the model wrote runs no script here)."""
    row = s.exec(select(SentFile.name, SentFile.mime, SentFile.data).where(SentFile.id == file_id)).first()
    if row is None:
        raise HTTPException(404, "no such file")
    name, mime, data = row
    # The type as stored, without the charset Starlette would add to a text/* type: the bytes are the file's own.
    return Response(data, headers={
        "Content-Type": mime, "Content-Disposition": f"attachment; filename*=UTF-8''{quote(name)}",
        "X-Content-Type-Options": "nosniff"})
