"""What a failed model call says: the wait the provider asked for, whether the model could be reached
at all, and what to check when it refused (no litellm here: these read the errors it raised)."""

from __future__ import annotations

import socket

import httpx

HINTS = {
    "AuthenticationError": "check the API key configured for the model",
    "PermissionDeniedError": "check the API key configured for the model",
    "NotFoundError": "check the model name and API base",
    "ContextWindowExceededError": "the conversation is too long for the model: send /new to start afresh",
    "ContentPolicyViolationError": "the provider's content policy refused this request",
}


def unreachable(err: BaseException) -> bool:
    """A refused connection or an unknown host (litellm reports both as an InternalServerError)."""
    seen: BaseException | None = err
    for _ in range(10):  # the chain: litellm's error, the SDK's, httpx's, the socket's
        if seen is None:
            return False
        if isinstance(seen, httpx.ConnectError | ConnectionRefusedError | socket.gaierror):
            return True
        seen = seen.__cause__ or seen.__context__
    return False


def retry_after(err: Exception) -> float | None:
    """Seconds from a Retry-After header on the provider's answer, when there is one."""
    headers = getattr(err, "litellm_response_headers", None) or getattr(getattr(err, "response", None), "headers", {})
    value = headers.get("retry-after") or headers.get("Retry-After")
    try:
        return float(value) if value is not None else None
    except ValueError:
        return None
