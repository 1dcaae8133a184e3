"""Request ids: taken from `x-request-id` (or made up), echoed back, and on the access log line."""

from __future__ import annotations

import logging
from pathlib import Path

import pytest

from shared.logs import ContextFilter
from shared.settings import load_settings
from tests.support.stack import API_KEY, api_client


def test_the_access_log_line_carries_the_request_id(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    caplog.handler.addFilter(ContextFilter())  # what configure_logging puts on the real handler
    for client in api_client(load_settings(workspace=tmp_path, api_keys=[API_KEY])):
        with caplog.at_level(logging.INFO, logger="gateway"):
            answer = client.get("/api/v1/tools", headers={"x-request-id": "trace-me-123"})
            refused = client.get("/api/v1/tools", headers={"x-request-id": "trace-me-456", "Authorization": "x"})
    assert answer.headers["x-request-id"] == "trace-me-123" and refused.status_code == 401
    by_status = {r.getMessage().split()[2]: r for r in caplog.records
                 if r.name == "gateway" and r.getMessage().startswith("GET /api/v1/tools ")}
    assert by_status["200"].request_id == "trace-me-123"  # type: ignore[attr-defined]
    assert by_status["401"].request_id == "trace-me-456"  # type: ignore[attr-defined]
