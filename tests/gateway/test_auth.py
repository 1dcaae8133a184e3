"""Bearer-key auth on the API: any wrong key, however it is written, is a 401 and never a 500."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from shared.settings import SettingsError, load_settings
from tests.support.stack import API_KEY, api_client

LATIN1 = st.text(alphabet=st.characters(min_codepoint=0x21, max_codepoint=0xFF, exclude_characters="\x7f"),
                 min_size=1, max_size=40)


def test_a_non_ascii_bearer_token_is_refused_with_401(tmp_path: Path) -> None:
    for client in api_client(load_settings(workspace=tmp_path, api_keys=[API_KEY])):
        for token in (b"\xe9t\xe9", b"caf\xc3\xa9", API_KEY.encode() + b"\xff"):
            answer = client.get("/api/v1/tools", headers={"Authorization": b"Bearer " + token})
            assert answer.status_code == 401, (token, answer.text)
        assert client.get("/api/v1/tools").status_code == 200


@settings(max_examples=100, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(token=LATIN1)
def test_any_wrong_token_is_a_401(tmp_path: Path, token: str) -> None:
    for client in api_client(load_settings(workspace=tmp_path, api_keys=[API_KEY])):
        answer = client.get("/api/v1/tools", headers={"Authorization": f"Bearer {token}".encode("latin-1")})
        assert answer.status_code == (200 if token == API_KEY else 401), (token, answer.text)


def test_an_unauthenticated_body_is_not_read(tmp_path: Path) -> None:
    """The key is checked before anything reads the body: a client without one cannot make the
    gateway take in (and parse) a large upload first."""
    sent: list[int] = []

    def upload() -> Iterator[bytes]:
        for n in range(1, 65):
            sent.append(n)
            yield b"a" * 64 * 1024

    for client in api_client(load_settings(workspace=tmp_path, api_keys=[API_KEY])):
        answer = client.post("/api/v1/conversations/c/messages", content=upload(),
                             headers={"Authorization": "Bearer wrong", "content-type": "application/json"})
        assert answer.status_code == 401 and answer.headers["www-authenticate"] == "Bearer"
        assert answer.json() == {"detail": "missing or invalid API key"}
        assert sent == []


@pytest.mark.parametrize("headers", [{}, {"Authorization": "Bearer wrong"}, {"Authorization": f"Basic {API_KEY}"},
                                     {"Authorization": API_KEY}])
def test_no_key_is_a_401_whatever_the_body(tmp_path: Path, headers: dict[str, str]) -> None:
    """Without a valid key the answer is 401, not a verdict on the body (a 422 would mean it was parsed)."""
    for client in api_client(load_settings(workspace=tmp_path, api_keys=[API_KEY])):
        client.headers.pop("Authorization")
        for method, path in (("POST", "/api/v1/conversations"), ("POST", "/api/v1/conversations/c/chat"),
                             ("POST", "/api/v1/cron"), ("GET", "/api/v1/runs/x"), ("GET", "/api/v1/no-such-route")):
            answer = client.request(method, path, content=b"not json",
                                    headers={**headers, "content-type": "application/json"})
            assert answer.status_code == 401, (method, path, answer.text)


def test_with_no_keys_configured_the_api_is_closed(tmp_path: Path) -> None:
    for client in api_client(load_settings(workspace=tmp_path, api_keys=[])):
        answer = client.post("/api/v1/conversations", content=b"not json", headers={"content-type": "application/json"})
        assert answer.status_code == 401
        assert "NANOFLEET_API_KEYS" in answer.json()["detail"]
        assert client.get("/healthz").status_code == 200


@pytest.mark.parametrize("keys", ['[""]', '["  "]', '["two words"]'])
def test_an_empty_or_spaced_key_stops_the_start(monkeypatch: pytest.MonkeyPatch, keys: str) -> None:
    """NANOFLEET_API_KEYS='[""]' started a gateway no key could open (an empty key matches nothing),
    without a word of why; a key with a space cannot be sent in a header."""
    monkeypatch.setenv("NANOFLEET_API_KEYS", keys)
    with pytest.raises(SettingsError) as err:
        load_settings()
    assert "NANOFLEET_API_KEYS" in str(err.value) and "must not be empty or hold spaces" in str(err.value)

