"""The LLM client: the only module that imports litellm. Per-call keys and bases, retries with
backoff that honour Retry-After, streamed deltas, usage and cost."""

from __future__ import annotations

import functools
import json
import logging
import os
import random
import time
import warnings
from collections.abc import Callable
from typing import Any, TypeVar

import httpx

from shared.llm_answers import answered, streamed
from shared.llm_faults import retry_after, user_message
from shared.llm_images import without_images
from shared.llm_types import LLMError, LLMResponse
from shared.settings import LLMProfile, LLMSettings

os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")  # never fetch the cost map at import
# OpenAI-compatible calls through litellm's own httpx handler rather than the openai SDK, whose
# request transform walks every message and tool schema: about half the cost of a call (15 -> 7 ms
# against the loopback fake with 12 tools). Set it to "False" in the environment for the SDK path.
os.environ.setdefault("EXPERIMENTAL_OPENAI_BASE_LLM_HTTP_HANDLER", "True")

log = logging.getLogger(__name__)
T = TypeVar("T")
DEFAULT_CONTEXT_WINDOW = 128_000  # tokens: a model's that neither its profile nor litellm's map sizes; the most assumed
# litellm's own handler builds a pydantic schema that warns, once per process, about a ReadOnly item
warnings.filterwarnings("ignore", message="Item .* is using the `ReadOnly` qualifier", category=UserWarning)


@functools.cache
def _litellm() -> Any:  # the litellm module
    """litellm, imported and set up on first use: about 2.5 s of CPU and 170 MiB of memory that the
    processes calling no model (the gateway, beat, the tools and outbound workers) never pay."""
    import litellm

    litellm.suppress_debug_info = True  # no provider banners on stdout (keys and bases stay per call)
    # litellm hands every streamed chunk to its logging callbacks (which nanofleet does not use) in a
    # thread that starts an event loop per chunk: most of the cost of a streamed call.
    litellm.disable_streaming_logging = True
    litellm.REPEATED_STREAMING_CHUNK_LIMIT = 10_000  # type: ignore[misc]  # 100 equal chunks failed a stream
    return litellm


@functools.cache
def _retryable_errors() -> tuple[type[Exception], ...]:
    lib = _litellm()
    return (lib.RateLimitError, lib.APIConnectionError, lib.Timeout, lib.InternalServerError,
            lib.ServiceUnavailableError, lib.BadGatewayError)


@functools.cache
def _litellm_errors() -> tuple[type[Exception], ...]:
    """Every error litellm raises for a provider's answer (or its absence), the retryable first."""
    retry = _retryable_errors()
    return (*retry, *(t for t in _litellm().LITELLM_EXCEPTION_TYPES
                      if issubclass(t, Exception) and not issubclass(t, retry)))


def retryable(err: Exception) -> bool:
    """A fault that may pass: rate limits, timeouts, connection errors and any 5xx (a 520 or 529
    from a proxy arrives as a plain APIError). Anything else the provider would answer the same again."""
    return isinstance(err, _retryable_errors()) or (getattr(err, "status_code", None) or 0) >= 500


def missing_key(settings: LLMSettings) -> list[str]:
    """The provider's key variables (any one will do) when the default model wants a key and has
    none: not in the settings, nor an endpoint of one's own (a local server may need none), nor
    the provider's own variable, which litellm reads. Empty when it cannot tell."""
    if settings.api_key or settings.api_base:
        return []
    try:
        wanted = _litellm().validate_environment(model=settings.model).get("missing_keys") or []
    except Exception:  # a model string litellm cannot place: the first call says what is wrong
        return []
    return [k for k in wanted if k.endswith("_API_KEY")]  # not cloud credentials (AWS_...) or bases


def unplaced(model: str) -> bool:
    """Whether litellm places no provider for `model` (a bare name it does not know): every call fails."""
    try:
        _litellm().get_llm_provider(model)
    except Exception:
        return True
    return False


class _ProcessTransport(httpx.HTTPTransport):
    """One connection pool for the whole process; litellm closes the clients it evicts from its cache
    (hourly), and that must not close connections other calls are using."""

    def close(self) -> None:
        pass


@functools.cache
def _pool(max_connections: int) -> None:
    """litellm's HTTP clients default to httpx's pool of 100 connections: a worker holding more LLM
    calls than that would queue them. Every client litellm builds takes our transport instead: the
    openai SDK's through `client_session`, its own handler's through `sync_transport` (transport
    only: keys and bases stay per call)."""
    transport = _ProcessTransport(limits=httpx.Limits(max_connections=max_connections, max_keepalive_connections=100))
    lib = _litellm()
    lib.client_session = httpx.Client(transport=transport, follow_redirects=True)
    lib.sync_transport = transport


class _Relay:
    """Passes streamed text on, and remembers whether any was."""

    def __init__(self, to: Callable[[str], None]) -> None:
        self.to, self.sent = to, False

    def __call__(self, text: str) -> None:
        self.sent = True
        self.to(text)


class LLMClient:
    """Chat completions through litellm with nanofleet's retry and usage rules."""

    def __init__(self, settings: LLMSettings) -> None:
        self.settings = settings
        self._sees: dict[str | None, bool] = {}

    def profile(self, model: str | None = None) -> LLMProfile:
        """A named profile, a raw litellm model string (a request's, any provider's), or the default.
        One of the default model's provider, as litellm places them ("openai/..." or "gpt-4o" beside
        "openai/..."), uses the default's
        endpoint and key (a profile: unless it sets its own); any other keeps to its own, or its
        provider's environment variable: one provider's key must never go to another."""
        if model and model in self.settings.profiles:
            named = self.settings.profiles[model]
            if not _same_provider(named.model, self.settings.model):
                return named
            unset = [f for f in ("api_base", "api_key") if f not in named.model_fields_set]
            return named.model_copy(update={f: getattr(self.settings, f) for f in unset})
        if model and model != self.settings.model:  # the default's limits; not its prices (another model's)
            endpoint = {} if _same_provider(model, self.settings.model) else {"api_base": None, "api_key": None}
            return self.settings.model_copy(update={"model": model, "input_cost_per_token": None,
                                                    "output_cost_per_token": None, "vision": None, **endpoint})
        return self.settings

    def longest(self) -> float:
        return self.settings.longest()

    def sees_images(self, model: str | None = None) -> bool:
        """Whether the model takes images: its profile's `vision`, else litellm's model map (asked once)."""
        if model not in self._sees:
            profile = self.profile(model)
            self._sees[model] = profile.vision if profile.vision is not None else _vision(profile.model)
        return self._sees[model]

    def complete(
        self,
        messages: list[dict[str, Any]],
        *,
        tools: list[dict[str, Any]] | None = None,
        model: str | None = None,
        on_delta: Callable[[str], None] | None = None,
    ) -> LLMResponse:
        """The answer of `model` (a profile, a model string, or None: the default); when that fails
        for good, each of the fallbacks' in turn (one that sees no images is told of the photos), unless
        streamed text already went out. When none answers, the error's user_message is the first
        model's (the logs have every one's)."""
        relay = _Relay(on_delta) if on_delta else None
        chain = list(dict.fromkeys([model, *self.settings.fallbacks]))
        failures: list[LLMError] = []
        for i, name in enumerate(chain):
            profile = self.profile(name)
            sent = messages if i == 0 or self.sees_images(name) else without_images(messages)
            try:
                return self._retrying(functools.partial(self._call, profile, sent, tools, relay), relay)
            except LLMError as err:
                failures.append(err)
                if (relay and relay.sent) or i + 1 == len(chain):
                    break
                log.warning("model %s failed (%s); trying %s", profile.model, err, self.profile(chain[i + 1]).model)
        if len(failures) == 1:
            raise failures[0]
        tried = "; ".join(f"{self.profile(name).model}: {err}" for name, err in zip(chain, failures, strict=False))
        raise LLMError(tried, user_message=failures[0].user_message) from failures[-1]

    def transcribe(self, audio: bytes, filename: str) -> str:
        """The words of a voice message, by the transcription model, retried as a chat call is;
        raises LLMError (with a user_message) when it cannot."""
        profile = self.profile(self.settings.transcription_model)

        def call() -> str:
            _pool(self.settings.max_connections)
            lib, key = _litellm(), profile.api_key.get_secret_value() if profile.api_key else None
            try:
                answer = lib.transcription(model=profile.model, file=(filename, audio), api_base=profile.api_base,
                                           api_key=key, timeout=self.settings.timeout, max_retries=0)
            except Exception as err:  # the SDK's own errors get through litellm's transcription unmapped
                if isinstance(err, _litellm_errors()):
                    raise
                lib.exception_type(model=profile.model, original_exception=err,
                                   custom_llm_provider=_provider(profile.model) or None)  # raises litellm's
                raise
            return str(getattr(answer, "text", "") or "").strip()

        return self._retrying(call, None)

    def _retrying(self, call: Callable[[], T], relay: _Relay | None) -> T:
        """`call()`, tried again after a fault that may pass (not once streamed text went out)."""
        attempt = 0
        while True:
            try:
                return call()
            except Exception as err:
                if not isinstance(err, _litellm_errors()):  # a fault in the client itself: a reply, not a hang
                    log.exception("LLM call failed unexpectedly")
                    raise LLMError(f"{type(err).__name__}: {err}", user_message=_user_message(err)) from err
                attempt += 1
                wait = retry_after(err)
                if not retryable(err) or attempt > self.settings.max_retries or (relay and relay.sent) \
                        or (wait or 0) > self.settings.retry_max_delay:  # streamed text would show twice
                    tries = f"{attempt} tries" if attempt > 1 else "not retried" if not retryable(err) else "1 try"
                    raise LLMError(f"{err} ({tries})", user_message=_user_message(err, wait)) from err
                delay = wait or min(random.uniform(0, self.settings.retry_base_delay * 2**attempt),
                                    self.settings.retry_max_delay)
                log.warning("LLM call failed (%s); retry %d in %.1fs", type(err).__name__, attempt, delay)
                time.sleep(delay)

    def _call(
        self,
        profile: LLMProfile,
        messages: list[dict[str, Any]],
        tools: list[dict[str, Any]] | None,
        on_delta: Callable[[str], None] | None,
    ) -> LLMResponse:
        _pool(self.settings.max_connections)
        kwargs: dict[str, Any] = {
            "model": profile.model,
            "messages": messages,
            "api_base": profile.api_base,
            "api_key": profile.api_key.get_secret_value() if profile.api_key else None,
            "timeout": self.settings.timeout,
            "num_retries": 0,
            "max_retries": 0,
        }
        if tools:
            kwargs["tools"] = tools
        if profile.temperature is not None:
            kwargs["temperature"] = profile.temperature
        if profile.max_tokens is not None:
            kwargs["max_tokens"] = profile.max_tokens
        if on_delta is None:
            answer = _parse(_litellm().completion(**kwargs), profile.model)
        else:
            kwargs.update(stream=True, stream_options={"include_usage": True})
            answer = _streamed(_litellm().completion(**kwargs), on_delta, profile.model)
        price_in, price_out = profile.input_cost_per_token, profile.output_cost_per_token
        if price_in is not None and price_out is not None:  # wins over litellm's map, kept out of its globals
            answer.usage.cost = answer.usage.prompt_tokens * price_in + answer.usage.completion_tokens * price_out
        return answer

    def warm(self) -> None:
        """Import litellm and pay its lazy imports before the first real call (a call with tools pulls
        in the MCP SDK: about 0.5 s) with a mock answer from litellm itself, no network; load the
        tokenizer every real call and prompt fit uses (about 0.15 s); and set up the connection pool
        while one thread runs, not the first calls' many."""
        _pool(self.settings.max_connections)
        tool = {"type": "function", "function": {"name": "warm_up", "parameters": {"type": "object"}}}
        messages = [{"role": "user", "content": "warm-up"}]
        try:
            _litellm().completion(model=self.settings.model, messages=messages, tools=[tool], mock_response="ok")
        except Exception as err:  # a model string litellm cannot map fails later, with a reply
            log.debug("LLM warm-up skipped: %s", err)
        self.count_tokens(messages)

    def prompt_budget(self, model: str | None = None, answer: int = 4096) -> int:
        """The tokens a prompt may take: the model's context window less room for the answer (its
        max_tokens; else `answer`, at most a quarter of a small window). The window is the profile's
        context_window or, unset, litellm's figure for the model, at most DEFAULT_CONTEXT_WINDOW."""
        profile = self.profile(model)
        window = profile.context_window or min(DEFAULT_CONTEXT_WINDOW, _known_window(profile.model))
        return max(window // 4, window - (profile.max_tokens or min(answer, window // 4)))

    def count_tokens(self, messages: list[dict[str, Any]], model: str | None = None,
                     tools: list[dict[str, Any]] | None = None) -> int:
        """Prompt tokens for these messages (tool calls included) and tool schemas, as the model would count."""
        try:
            counted = _litellm().token_counter(model=self.profile(model).model, messages=messages, tools=tools or None)
            return int(counted)
        except Exception:  # unknown tokenizer: a safe over-estimate
            return sum(len(json.dumps(m, default=str)) for m in [*messages, *(tools or [])]) // 3


@functools.lru_cache(maxsize=256)
def _known_window(model: str) -> int:
    """The prompt tokens litellm's model map gives the model, DEFAULT_CONTEXT_WINDOW when it has none."""
    try:
        info = _litellm().get_model_info(model=model)
        return int(info.get("max_input_tokens") or info.get("max_tokens") or DEFAULT_CONTEXT_WINDOW)
    except Exception:  # a model the map cannot place
        return DEFAULT_CONTEXT_WINDOW


def _vision(model: str) -> bool:
    try:
        return bool(_litellm().supports_vision(model=model))
    except Exception:  # a model the map cannot place
        return False


def _parse(response: Any, model: str) -> LLMResponse:
    hidden = getattr(response, "_hidden_params", None) or {}
    cost = hidden.get("response_cost")  # litellm priced it already, or found no price (None): no second try
    if cost is None and "response_cost" not in hidden:
        try:
            cost = _litellm().completion_cost(completion_response=response, model=model)
        except Exception:  # models without a price in the map
            cost = 0.0
    return answered(response, model, float(cost or 0.0))


def _streamed(stream: Any, on_delta: Callable[[str], None], model: str) -> LLMResponse:
    answer = streamed(stream, on_delta, model)
    try:
        answer.usage.cost = float(sum(_litellm().cost_per_token(
            model=model, prompt_tokens=answer.usage.prompt_tokens, completion_tokens=answer.usage.completion_tokens)))
    except Exception:  # models without a price in the map
        answer.usage.cost = 0.0
    return answer


def _user_message(err: Exception, wait: float | None = None) -> str:
    return user_message(err, wait, may_pass=retryable(err), from_provider=isinstance(err, _litellm_errors()))


def _provider(model: str) -> str:
    """The litellm provider a model string names ("openai" in "openai/gpt-4.1-mini"; "" without one)."""
    provider, slash, _ = model.partition("/")
    return provider if slash else ""


@functools.lru_cache(maxsize=512)
def _placed(model: str) -> str:
    """The provider litellm sends `model` to ("openai" for "gpt-4o" too; "" where it places none)."""
    try:
        return str(_litellm().get_llm_provider(model)[1])
    except Exception:
        return ""


def _same_provider(model: str, default: str) -> bool:
    """Whether `model` goes where the default model goes, as litellm places them (one it cannot place
    may be anyone's)."""
    return model == default or (_placed(model) != "" and _placed(model) == _placed(default))
