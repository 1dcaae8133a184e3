"""The LLM client in-process against the fake OpenAI-compatible server: its connection pool and the
errors it maps, on both of litellm's paths (its own httpx handler, the default; the openai SDK)."""

from __future__ import annotations

import base64
import json
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor

import litellm
import pytest

from shared.llm import LLMClient, LLMError, LLMResponse
from shared.llm_images import NOT_SHOWN
from shared.settings import LLMProfile, LLMSettings, load_settings
from tests.fakes.llm import FakeLLM, Reply, default_handler
from tests.support.processes import wait_until

USER = [{"role": "user", "content": "hi"}]


@pytest.fixture(params=["True", "False"], ids=["httpx-handler", "openai-sdk"])
def client(request: pytest.FixtureRequest, fake_llm: FakeLLM, monkeypatch: pytest.MonkeyPatch) -> Iterator[LLMClient]:
    monkeypatch.setenv("EXPERIMENTAL_OPENAI_BASE_LLM_HTTP_HANDLER", request.param)
    fake_llm.reset()
    yield LLMClient(LLMSettings(model="openai/fake", api_base=fake_llm.url, api_key="k", max_retries=1,
                                retry_base_delay=0.01))
    fake_llm.reset()


def test_more_calls_are_open_at_once_than_httpx_default_pool(client: LLMClient, fake_llm: FakeLLM) -> None:
    fake_llm.handler = lambda body: Reply(text="slow", delay=5)  # long enough for 150 threads to start on a busy host
    with ThreadPoolExecutor(150) as pool:
        futures = [pool.submit(client.complete, USER) for _ in range(150)]
        wait_until(lambda: fake_llm.in_flight == 150, timeout=20, message="150 calls open at the fake at once")
        assert all(f.result().content == "slow" for f in futures)


@pytest.mark.parametrize(("status", "hint"), [(401, "API key"), (404, "model name"), (400, "will not help")])
def test_a_refused_request_is_not_retried(client: LLMClient, fake_llm: FakeLLM, status: int, hint: str) -> None:
    fake_llm.handler = lambda body: Reply(status=status)
    with pytest.raises(LLMError) as err:
        client.complete(USER)
    assert hint in err.value.user_message and fake_llm.calls() == 1
    assert str(err.value).endswith("(not retried)")  # the log says so, not "after retries"


@pytest.mark.parametrize("api_base", ["http://127.0.0.1:1/v1", "http://no-such-host.invalid/v1"])
def test_a_model_nobody_can_reach_is_reported_as_such(api_base: str) -> None:
    """litellm reports a refused connection and an unknown host as an InternalServerError, which the
    reply used to name, as if the provider had failed."""
    client = LLMClient(LLMSettings(model="openai/fake", api_base=api_base, api_key="k", max_retries=0))
    with pytest.raises(LLMError) as err:
        client.complete(USER)
    assert "couldn't reach the language model" in err.value.user_message
    assert "InternalServerError" not in err.value.user_message


def test_a_model_string_without_a_provider_says_so() -> None:
    with pytest.raises(LLMError) as err:
        LLMClient(LLMSettings(model="nosuchprovider/foo", api_key="k", max_retries=0)).complete(USER)
    assert "the model 'nosuchprovider/foo' names no provider" in err.value.user_message


@pytest.mark.parametrize("status", [503, 520, 529])  # 520/529: a proxy's or an overloaded provider's
def test_server_errors_are_retried_then_reported(client: LLMClient, fake_llm: FakeLLM, status: int) -> None:
    answers = iter([Reply(status=status)])
    fake_llm.handler = lambda body: next(answers, None) or default_handler(body)
    assert client.complete(USER).content == "echo: hi" and fake_llm.calls() == 2
    fake_llm.handler = lambda body: Reply(status=500)
    with pytest.raises(LLMError) as err:
        client.complete(USER)
    assert "try again in a moment" in err.value.user_message
    assert str(err.value).endswith(f"({client.settings.max_retries + 1} tries)")


def test_a_retry_after_beyond_the_longest_wait_is_reported_not_cut_short(client: LLMClient,
                                                                         fake_llm: FakeLLM) -> None:
    fake_llm.handler = lambda body: Reply(status=429, headers={"retry-after": "60"})
    with pytest.raises(LLMError) as err:
        client.complete(USER)
    assert "try again in 60 seconds" in err.value.user_message and fake_llm.calls() == 1


def test_a_stream_that_breaks_after_text_went_out_is_not_retried(client: LLMClient,
                                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    """A retry would stream the same text again to every SSE reader."""
    calls: list[str] = []

    def broken(profile: object, messages: object, tools: object, on_delta: Callable[[str], None]) -> LLMResponse:
        calls.append("call")
        on_delta("Hello")
        raise litellm.APIConnectionError("connection reset", llm_provider="openai", model="fake")

    monkeypatch.setattr(client, "_call", broken)
    shown: list[str] = []
    with pytest.raises(LLMError):
        client.complete(USER, on_delta=shown.append)
    assert calls == ["call"] and shown == ["Hello"]


def test_an_answer_the_client_cannot_read_is_a_reply_not_a_crash(client: LLMClient, fake_llm: FakeLLM) -> None:
    fake_llm.handler = lambda body: Reply(raw={"id": "x", "object": "chat.completion", "created": 0, "model": "m",
                                               "choices": []})
    with pytest.raises(LLMError) as err:
        client.complete(USER)
    assert "something went wrong" in err.value.user_message and fake_llm.calls() == 1


def test_a_streamed_answer_is_the_same_answer(client: LLMClient, fake_llm: FakeLLM) -> None:
    """Text deltas as they come, then the same content, tool calls (arguments streamed in pieces)
    and usage as the answer without streaming; cost from litellm's price map for a priced model."""
    calls = [("time", {}), ("record", {"tag": "a longer argument, streamed in several pieces", "n": 3})]
    fake_llm.handler = lambda body: Reply(text="Let me look that up for you, in two calls.", tool_calls=calls)
    priced = LLMClient(client.settings.model_copy(update={"model": "openai/gpt-4o-mini"}))
    plain = priced.complete(USER)
    deltas: list[str] = []
    streamed = priced.complete(USER, on_delta=deltas.append)
    with fake_llm.lock:
        assert [bool(b.get("stream")) for b in fake_llm.requests] == [False, True]
    assert len(deltas) > 1 and "".join(deltas) == streamed.content == plain.content
    assert [(c.name, json.loads(c.arguments)) for c in streamed.tool_calls] == calls
    assert all(c.id.startswith("call_") for c in streamed.tool_calls)
    assert streamed.usage == plain.usage and streamed.usage.cost > 0


def test_a_streamed_answer_of_many_equal_chunks_is_not_taken_for_a_loop(client: LLMClient, fake_llm: FakeLLM) -> None:
    """litellm failed a streamed answer at its 100th identical chunk in a row (2,000 dashes); the
    same answer unstreamed went through, so a page watching the conversation made it fail."""
    fake_llm.handler = lambda body: Reply(text="-" * 3200)  # 200 chunks of 16 dashes
    deltas: list[str] = []
    assert client.complete(USER, on_delta=deltas.append).content == "-" * 3200 == "".join(deltas)


def test_a_profile_prices_a_model_the_price_map_does_not_know(client: LLMClient, fake_llm: FakeLLM) -> None:
    """A self-hosted model costs nothing by litellm's map; its profile's prices count, streamed or not."""
    assert client.complete(USER).usage.cost == 0.0
    priced = LLMClient(client.settings.model_copy(update={"input_cost_per_token": 1e-6, "output_cost_per_token": 4e-6}))
    for answer in (priced.complete(USER), priced.complete(USER, on_delta=lambda _: None)):
        u = answer.usage
        assert u.prompt_tokens > 0 and u.completion_tokens > 0
        assert u.cost == pytest.approx(u.prompt_tokens * 1e-6 + u.completion_tokens * 4e-6)
    assert priced.complete(USER, model="openai/another-model").usage.cost == 0.0  # not the default's prices


def test_a_profile_of_the_default_provider_uses_the_default_endpoint_and_key(fake_llm: FakeLLM) -> None:
    """{"cheap": {"model": "openai/gpt-4.1-nano"}} beside NANOFLEET_LLM__API_BASE/API_KEY: the profile
    goes where the default goes. One of another provider keeps to its own (or its provider's env)."""
    fake_llm.reset()
    client = LLMClient(LLMSettings(model="openai/fake", api_base=fake_llm.url, api_key="k", max_retries=0, profiles={
        "cheap": {"model": "openai/cheap-model"},
        "own": {"model": "openai/own-model", "api_base": "http://127.0.0.1:9/v1", "api_key": "own-key"},
        "other": {"model": "anthropic/claude-x"},
        "bare": {"model": "claude-3-5-sonnet-20241022"},  # no provider named: it may be anyone's
    }))
    assert client.complete(USER, model="cheap").content == "echo: hi"
    with fake_llm.lock:
        assert [r["model"] for r in fake_llm.requests] == ["cheap-model"]
    own = client.profile("own")
    assert own.api_base == "http://127.0.0.1:9/v1" and own.api_key and own.api_key.get_secret_value() == "own-key"
    for name in ("other", "bare"):
        assert (client.profile(name).api_base, client.profile(name).api_key) == (None, None), name
    unnamed = LLMClient(LLMSettings(model="gpt-4o", api_key="openai-key", profiles=client.settings.profiles))
    assert unnamed.profile("bare").api_key is None  # two models naming no provider may be two providers


def test_a_model_string_of_another_provider_never_gets_the_default_key() -> None:
    """A request's `model` may name any provider: the default's key and endpoint go only with models
    of the default's provider (sent to Anthropic, an OpenAI key leaked to it)."""
    client = LLMClient(LLMSettings(model="openai/gpt-4.1-mini", api_base="http://127.0.0.1:9/v1", api_key="sk-openai"))
    for model in ("openai/gpt-4.1", "gpt-4o"):  # OpenAI's, as litellm places them
        mine = client.profile(model)
        assert mine.api_base == "http://127.0.0.1:9/v1"
        assert mine.api_key and mine.api_key.get_secret_value() == "sk-openai"
    for model in ("anthropic/claude-3-5-sonnet-20240620", "mistral/mistral-small-latest", "claude-3-5-sonnet-latest",
                  "no-such-model"):
        other = client.profile(model)
        assert (other.model, other.api_base, other.api_key) == (model, None, None), model
        assert other.timeout == client.settings.timeout  # the default's limits still hold
    bare = LLMClient(LLMSettings(model="gpt-4o", api_base="http://127.0.0.1:9/v1", api_key="sk-openai"))
    assert bare.profile("gpt-4o") is bare.settings  # the default itself, named by a request: its key, its prices


def _with_fallbacks(client: LLMClient) -> LLMClient:
    profiles = {"backup": LLMProfile(model="openai/backup-model", input_cost_per_token=1e-6,
                                     output_cost_per_token=1e-6)}
    return LLMClient(client.settings.model_copy(update={"profiles": profiles,
                                                        "fallbacks": ["backup", "openai/third-model"]}))


def _models(fake_llm: FakeLLM) -> list[str]:
    with fake_llm.lock:
        return [r["model"] for r in fake_llm.requests]


def test_a_model_that_fails_for_good_hands_the_call_to_the_next_fallback(client: LLMClient,
                                                                          fake_llm: FakeLLM) -> None:
    """After its retries the default model gives way to the first fallback, which answers with its
    own model and prices; the rest are not called."""
    fake_llm.handler = lambda body: Reply(status=503) if body["model"] == "fake" else default_handler(body)
    answer = _with_fallbacks(client).complete(USER)
    assert (answer.content, answer.model) == ("echo: hi", "openai/backup-model")
    assert answer.usage.cost == pytest.approx((answer.usage.prompt_tokens + answer.usage.completion_tokens) * 1e-6)
    assert _models(fake_llm) == ["fake"] * (client.settings.max_retries + 1) + ["backup-model"]


def test_when_every_model_fails_the_user_hears_the_first_ones_reason(client: LLMClient, fake_llm: FakeLLM) -> None:
    fake_llm.handler = lambda body: Reply(status=401)  # refused, not retried: the next model at once
    with pytest.raises(LLMError) as err:
        _with_fallbacks(client).complete(USER)
    assert _models(fake_llm) == ["fake", "backup-model", "third-model"]
    assert "API key" in err.value.user_message
    assert all(m in str(err.value) for m in ("openai/fake:", "openai/backup-model:", "openai/third-model:"))


def test_a_model_asked_for_by_name_falls_back_too(client: LLMClient, fake_llm: FakeLLM) -> None:
    fake_llm.handler = lambda body: Reply(status=404) if body["model"] == "asked" else default_handler(body)
    answer = _with_fallbacks(client).complete(USER, model="openai/asked")
    assert answer.model == "openai/backup-model" and _models(fake_llm) == ["asked", "backup-model"]


def test_a_fallback_that_sees_no_images_is_told_of_the_photos_instead(client: LLMClient, fake_llm: FakeLLM) -> None:
    """The prompt shows photos to a default model that sees them; a fallback that sees none would refuse
    the image parts (or the provider would), and is sent a line naming them."""
    url = "data:image/png;base64," + base64.b64encode(b"\x89PNG\r\n\x1a\n").decode()
    photos = [{"role": "user", "content": [{"type": "text", "text": "what is it?"},
                                           *[{"type": "image_url", "image_url": {"url": url}}] * 2]}]
    seeing = LLMClient(client.settings.model_copy(update={
        "vision": True, "profiles": {"blind": LLMProfile(model="openai/blind", vision=False)}, "fallbacks": ["blind"]}))
    fake_llm.handler = lambda body: Reply(status=503) if body["model"] == "fake" else default_handler(body)
    assert seeing.complete(photos).content == f"echo: {NOT_SHOWN.format(n=2)}\nwhat is it?"
    with fake_llm.lock:
        sent = [json.dumps(r["messages"]) for r in fake_llm.requests]
    assert [("image_url" in m) for m in sent] == [True] * (client.settings.max_retries + 1) + [False]


def test_a_stream_that_broke_after_text_went_out_does_not_go_to_a_fallback(client: LLMClient,
                                                                           monkeypatch: pytest.MonkeyPatch) -> None:
    """The fallback's answer would follow the first model's half answer on every SSE reader."""
    fallible = _with_fallbacks(client)
    models: list[str] = []

    def broken(profile: LLMProfile, messages: object, tools: object, on_delta: Callable[[str], None]) -> LLMResponse:
        models.append(profile.model)
        on_delta("Hello")
        raise litellm.APIConnectionError("connection reset", llm_provider="openai", model="fake")

    monkeypatch.setattr(fallible, "_call", broken)
    with pytest.raises(LLMError):
        fallible.complete(USER, on_delta=lambda _: None)
    assert models == ["openai/fake"]


def test_a_fallback_must_name_a_profile_or_a_model() -> None:
    with pytest.raises(ValueError, match="'cheap' is neither a profile"):
        LLMSettings(fallbacks=["cheap"])
    one = LLMSettings(profiles={"cheap": LLMProfile(model="openai/gpt-4.1-nano")}, fallbacks=["cheap"])
    assert one.longest() == 2 * LLMSettings().longest()  # the time limits leave room for every model's retries


def test_a_voice_message_is_transcribed_and_a_failing_model_retried_as_a_chat_call_is(client: LLMClient,
                                                                                       fake_llm: FakeLLM) -> None:
    """litellm's transcription lets the openai SDK's errors through as they are: they are mapped, so a
    503 is retried and a 401 is not, and the user hears why."""
    hearing = LLMClient(client.settings.model_copy(update={"transcription_model": "openai/whisper-test"}))
    assert hearing.transcribe(b" book a table ", "v.oga") == "book a table"
    fake_llm.transcription_status = 503
    with pytest.raises(LLMError) as err:
        hearing.transcribe(b"hello", "v.oga")
    assert "try again" in err.value.user_message
    fake_llm.transcription_status = 401
    with pytest.raises(LLMError) as err:
        hearing.transcribe(b"hello", "v.oga")
    assert "API key" in err.value.user_message
    retries = client.settings.max_retries
    assert [t["model"] for t in fake_llm.transcriptions] == ["whisper-test"] * (1 + retries + 1 + 1)


def test_whether_a_model_sees_images_is_its_profiles_word_else_litellms_map() -> None:
    client = LLMClient(load_settings(llm={"model": "openai/gpt-4o-mini", "profiles": {
        "local": {"model": "openai/llava-13b", "vision": True}, "blind": {"model": "openai/gpt-4o", "vision": False},
    }}).llm)
    assert client.sees_images() and client.sees_images("openai/gpt-4o")  # the map's word
    assert client.sees_images("local") and not client.sees_images("blind")  # the operator's
    assert not client.sees_images("openai/llava-13b")  # a raw model string the map does not know
    assert not LLMClient(load_settings(llm={"model": "openai/gpt-4o-mini", "vision": False}).llm).sees_images()
