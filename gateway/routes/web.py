"""The web chat page at `/`: static files that talk to the REST API with the user's API key (kept
in the browser, never in the page). A strict Content-Security-Policy: the page loads and connects
only to this gateway, and runs no inline script."""

from __future__ import annotations

from functools import cache
from pathlib import Path

from fastapi import APIRouter, HTTPException
from fastapi.responses import Response

router = APIRouter(include_in_schema=False)
WEB = Path(__file__).resolve().parent.parent / "web"
FILES = {"chat.js": "text/javascript", "chat.css": "text/css"}
HEADERS = {
    "Content-Security-Policy": "default-src 'none'; script-src 'self'; style-src 'self'; connect-src 'self'; "
                               "base-uri 'none'; form-action 'none'; frame-ancestors 'none'",
    "X-Content-Type-Options": "nosniff",
    "Referrer-Policy": "no-referrer",
}


@cache
def _read(name: str) -> bytes:
    return (WEB / name).read_bytes()


@router.get("/")
def index() -> Response:
    return Response(_read("index.html"), media_type="text/html; charset=utf-8", headers=HEADERS)


@router.get("/web/{name}")
def asset(name: str) -> Response:
    if name not in FILES:
        raise HTTPException(404, "no such file")
    return Response(_read(name), media_type=f"{FILES[name]}; charset=utf-8", headers=HEADERS)
