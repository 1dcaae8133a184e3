"""What a failed model call says: the wait the provider asked for, whether the model could be reached
at all, what to check when it refused, and what its user is told (no litellm here: these read the
errors it raised)."""

from __future__ import annotations

import re
import socket

import httpx

HINTS = {
    "AuthenticationError": "check the API key configured for the model",
    "PermissionDeniedError": "check the API key configured for the model",
    "NotFoundError": "check the model name and API base",
    "ContextWindowExceededError": ("the conversation is too long for the model: send /new to start afresh, or "
                                   "a shorter message (if short ones fail too, the configured context_window is "
                                   "larger than the model's, or max_tokens leaves the prompt too little)"),
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


def user_message(err: Exception, wait: float | None, *, may_pass: bool, from_provider: bool) -> str:
    """What the user is told of a call that failed with `err`: `may_pass` when trying again later may
    succeed, `from_provider` when litellm raised it for the provider's answer (or its absence)."""
    kind = type(err).__name__
    if unreachable(err):
        return "Sorry, I couldn't reach the language model (no connection to it). Please try again in a moment."
    if kind == "BadRequestError" and "LLM Provider NOT provided" in str(err):
        named = re.search(r"You passed model=(\S+)", str(err))  # the default, a profile's, or the request's
        model = f"{named[1]!r} " if named else ""
        return (f"Sorry, the model {model}names no provider litellm knows: check the model name (a profile, or "
                "a litellm model string such as openai/gpt-4.1-mini).")
    if may_pass:
        when = f"in {wait:.0f} seconds" if wait else "in a moment"
        return f"Sorry, I couldn't get an answer from the language model right now ({kind}). Please try again {when}."
    if not from_provider:
        return f"Sorry, something went wrong calling the language model ({kind}); the logs say more."
    hint = HINTS.get(kind, "the request was refused; trying again will not help")
    return f"Sorry, the language model refused the request ({kind}): {hint}."
