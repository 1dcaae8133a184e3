"""Bearer-key auth on the API: any wrong key, however it is written, is a 401 and never a 500."""

from __future__ import annotations

from pathlib import Path

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from shared.settings import load_settings
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
