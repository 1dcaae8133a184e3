"""Start-up warnings: a platform with some of its credentials set but not all is named with what is
missing and a NANOFLEET_ variable that names no setting is named with the setting meant, when the
gateway starts and when a worker starts working; no API key at all is said by the gateway, which
serves the API (not only by a 404 or a 401 later)."""

from __future__ import annotations

import logging
import re
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from gateway.app import create_app
from shared.settings import SettingsError, load_settings
from shared.startup_checks import half_configured, unknown_variables, warn_model_key
from shared.tools import build_registry
from tests.support.processes import ROOT, wait_until
from tests.support.stack import Stack

TG = "NANOFLEET_CHANNELS__TELEGRAM__"
SLACK = "NANOFLEET_CHANNELS__SLACK__"


def warnings_at_gateway_start(caplog: pytest.LogCaptureFixture, api_keys: tuple[str, ...] = ("k-0123456789",),
                              llm: dict[str, str] | None = None, **channels: Any) -> list[str]:
    llm = {"api_key": "sk-0123456789"} if llm is None else llm
    settings = load_settings(redis_url="redis://127.0.0.1:1/0", api_keys=list(api_keys), channels=channels, llm=llm)
    with caplog.at_level(logging.WARNING):
        create_app(settings)
    return [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]


def test_half_configured_platforms_are_named_with_what_is_missing(caplog: pytest.LogCaptureFixture) -> None:
    warnings = warnings_at_gateway_start(caplog, telegram={"token": "123:abc"}, slack={"signing_secret": "s3cret"},
                                         whatsapp={"phone_number_id": "42"})
    assert len(warnings) == 3, warnings
    telegram, slack, whatsapp = sorted(warnings, key=lambda w: ["telegram", "slack", "whatsapp"].index(w.split()[0]))
    assert f"{TG}WEBHOOK_SECRET" in telegram and f"{TG}TOKEN" not in telegram
    assert f"{SLACK}BOT_TOKEN" in slack and f"{SLACK}SIGNING_SECRET" not in slack
    assert all(f"NANOFLEET_CHANNELS__WHATSAPP__{f}" in whatsapp for f in ("ACCESS_TOKEN", "APP_SECRET", "VERIFY_TOKEN"))


def test_platforms_left_unset_or_fully_set_start_quietly(caplog: pytest.LogCaptureFixture) -> None:
    full = {"telegram": {"token": "123:abc", "webhook_secret": "tg-secret"},
            "slack": {"api_base": "http://127.0.0.1:9", "allow_from": ["*"]}}  # no credentials: simply off
    assert warnings_at_gateway_start(caplog, **full) == []
    assert half_configured(load_settings(channels=full)) == {}


def test_a_worker_names_a_half_configured_platform(make_stack: Callable[..., Stack]) -> None:
    s = make_stack(CHANNELS__TELEGRAM__TOKEN="123456:only-the-token")
    worker = s.worker()
    s.beat()  # its sweep is the worker's first task, which builds the worker's runtime
    wait_until(lambda: f"{TG}WEBHOOK_SECRET" in worker.log(), timeout=60, message="the worker's warning")
    line = next(x for x in worker.log().splitlines() if f"{TG}WEBHOOK_SECRET" in x)
    assert '"level": "WARNING"' in line and "telegram is off" in line and "only-the-token" not in line


TYPOS = {  # variable -> (value, the setting meant)
    "NANOFLEET_API_KEY": ('["k-secret-value"]', "NANOFLEET_API_KEYS"),
    "NANOFLEET_LLM__APIKEY": ("sk-secret-value", "NANOFLEET_LLM__API_KEY"),
    "NANOFLEET_TOOLS__ALLOW": ('["time"]', "NANOFLEET_TOOLS__ALLOWED"),
    "NANOFLEET_CHANNEL__TELEGRAM__TOKEN": ("123:tg-secret-value", "NANOFLEET_CHANNELS__TELEGRAM__TOKEN"),
    "NANOFLEET_LLM__PROFILES__FAST__MODLE": ("openai/gpt-4.1-nano", "NANOFLEET_LLM__PROFILES__FAST__MODEL"),
    # a group left out, as the docs' short names (EXEC__RUN_AS_USER) invite
    "NANOFLEET_EXEC__RUN_AS_USER": ("agent", "NANOFLEET_TOOLS__EXEC__RUN_AS_USER"),
    "NANOFLEET_TELEGRAM__ALLOW_FROM": ('["4242"]', "NANOFLEET_CHANNELS__TELEGRAM__ALLOW_FROM"),
}


def test_a_misspelt_variable_is_named_with_the_setting_meant(caplog: pytest.LogCaptureFixture,
                                                              monkeypatch: pytest.MonkeyPatch) -> None:
    for var, (value, _) in TYPOS.items():
        monkeypatch.setenv(var, value)
    monkeypatch.setenv("NANOFLEET_SHOE_SIZE", "44")
    with pytest.raises(SettingsError, match="profile 'fast' names no model"):  # not the built-in default model
        load_settings()
    monkeypatch.setenv("NANOFLEET_LLM__PROFILES__FAST__MODEL", "openai/gpt-4.1-nano")  # the typo: only warned of
    warnings = warnings_at_gateway_start(caplog)
    for var, (value, meant) in TYPOS.items():
        [line] = [w for w in warnings if w.startswith(f"{var} ")]
        assert "is not a nanofleet setting, so it is ignored" in line and line.endswith(f"did you mean {meant}?")
        assert value not in line
    [line] = [w for w in warnings if w.startswith("NANOFLEET_SHOE_SIZE ")]
    assert line.endswith("see .env.example for every setting"), line


def test_a_misspelt_key_in_the_config_file_is_named_with_the_setting_meant(
        caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """As the settings library reads them: top-level keys in any case (`[LLM]` is read, `[lm]` is
    not), the keys below exactly (`[LLM] MODEL` is not read)."""
    path = tmp_path / "nanofleet.toml"
    path.write_text('[lm]\nmodel = "openai/gpt-4.1"\n[LLM]\nMODEL = "x"\n[tools]\nalowed = ["time"]\n'
                    '[tools.mcp_servers.gh]\nurl = "https://mcp.example.com"\ntiemout = 5\n'
                    '[tools.exec.env]\nGH_TOKEN = "t"\n[memory]\nwindow = 9\nshoe_size = 44\n')
    monkeypatch.setenv("NANOFLEET_CONFIG_FILE", str(path))
    warnings = [w.removeprefix(f"{path}: ") for w in warnings_at_gateway_start(caplog) if w.startswith(str(path))]
    assert sorted(warnings) == [
        "LLM.MODEL is not a nanofleet setting, so it is ignored: did you mean LLM.model?",
        "lm is not a nanofleet setting, so it is ignored: did you mean llm?",
        "memory.shoe_size is not a nanofleet setting, so it is ignored: see .env.example for every setting "
        "(as TOML tables)",
        "tools.alowed is not a nanofleet setting, so it is ignored: did you mean tools.allowed?",
        "tools.mcp_servers.gh.tiemout is not a nanofleet setting, so it is ignored: "
        "did you mean tools.mcp_servers.gh.timeout?",
    ], warnings


def test_no_api_key_is_said_once_with_the_variable_to_set(caplog: pytest.LogCaptureFixture) -> None:
    warnings = warnings_at_gateway_start(caplog, api_keys=())
    [line] = [w for w in warnings if "API key" in w]
    assert "refuses every request" in line and "NANOFLEET_API_KEYS" in line
    caplog.clear()
    with caplog.at_level(logging.WARNING):  # what a worker and `nanofleet agent` build: they serve no API
        build_registry(load_settings(api_keys=[], llm={"api_key": "sk-0123456789"}))
    assert not [r for r in caplog.records if "API key" in r.getMessage()], "`nanofleet agent` warned of it"


def model_key_warnings(caplog: pytest.LogCaptureFixture, llm: dict[str, str]) -> list[str]:
    caplog.clear()
    with caplog.at_level(logging.WARNING):
        warn_model_key(load_settings(llm=llm))
    return [r.getMessage() for r in caplog.records if "no key is set for the model" in r.getMessage()]


def test_a_hosted_model_without_a_key_is_said_where_the_model_is_called(caplog: pytest.LogCaptureFixture,
                                                                        monkeypatch: pytest.MonkeyPatch) -> None:
    """By the agent and subagent workers (test_a_worker_names_a_misspelt_variable) and `nanofleet
    agent`; the gateway, which calls no model, does not load litellm to ask."""
    monkeypatch.delenv("ANTHROPIC_API_KEY", raising=False)
    [line] = model_key_warnings(caplog, {"model": "anthropic/claude-sonnet-4"})
    assert "NANOFLEET_LLM__API_KEY (or ANTHROPIC_API_KEY)" in line and "NANOFLEET_LLM__API_BASE" in line
    caplog.clear()
    assert not [w for w in warnings_at_gateway_start(caplog, llm={"model": "anthropic/claude-sonnet-4"})
                if "no key is set" in w]
    monkeypatch.setenv("ANTHROPIC_API_KEY", "sk-ant-0123456789")  # litellm reads the provider's own variable
    monkeypatch.setenv("TOGETHERAI_API_KEY", "tg-0123456789")
    for llm in ({"model": "anthropic/claude-sonnet-4"}, {"model": "claude-3-5-sonnet-latest"},
                {"model": "together_ai/meta-llama/Llama-3-8b"},
                {"model": "openai/qwen3", "api_base": "http://127.0.0.1:8001/v1"}, {"model": "ollama/llama3"},
                {"model": "bedrock/anthropic.claude-v2"},  # cloud credentials may come from the machine's role
                {"model": "openai/gpt-4.1", "api_key": "sk-0123456789"}):
        assert not model_key_warnings(caplog, llm), llm


def test_settings_and_the_variables_read_elsewhere_are_not_warned_about() -> None:
    documented = re.findall(r"^# (NANOFLEET_[A-Z0-9_]+)=", (ROOT / ".env.example").read_text(), re.MULTILINE)
    assert len(documented) > 50, documented
    read_elsewhere = ["NANOFLEET_CONFIG_FILE", "NANOFLEET_PORT", "NANOFLEET_TEST_DATABASE_URL",
                      "NANOFLEET_TEST_REDIS_URL", "NANOFLEET_FUZZ_EXAMPLES", "NANOFLEET_HYPOTHESIS_PROFILE"]
    below_mappings = ["NANOFLEET_TOOLS__MCP_SERVERS__GH__HEADERS", "NANOFLEET_TOOLS__EXEC__ENV__GH_TOKEN",
                      "NANOFLEET_LLM__PROFILES__FAST__API_KEY", "NANOFLEET_TOOLS__MCP_SERVERS__GH"]
    whole_groups = ["NANOFLEET_LLM", "NANOFLEET_CHANNELS__TELEGRAM", "nanofleet_llm__model"]  # JSON; any case
    names = [*documented, *read_elsewhere, *below_mappings, *whole_groups]
    assert unknown_variables({name: "x" for name in names} | {"PATH": "/bin", "NANO_X": "y"}) == {}


def test_a_worker_names_a_misspelt_variable(make_stack: Callable[..., Stack], monkeypatch: pytest.MonkeyPatch) -> None:
    """...and, as it takes the agent queue, that the model has no key (the typo left it without)."""
    monkeypatch.delenv("ANTHROPIC_API_KEY", raising=False)
    s = make_stack(LLM__APIKEY="sk-only-in-the-typo", LLM__MODEL="anthropic/claude-sonnet-4", LLM__API_KEY="",
                   LLM__API_BASE="")
    worker = s.worker()
    s.beat()  # its sweep is the worker's first task, which builds the worker's runtime
    wait_until(lambda: "NANOFLEET_LLM__APIKEY" in worker.log(), timeout=60, message="the worker's warning")
    line = next(x for x in worker.log().splitlines() if "NANOFLEET_LLM__APIKEY" in x)
    assert '"level": "WARNING"' in line and "did you mean NANOFLEET_LLM__API_KEY?" in line
    assert "sk-only-in-the-typo" not in line
    [key] = [x for x in worker.log().splitlines() if "no key is set for the model" in x]
    assert '"level": "WARNING"' in key and "ANTHROPIC_API_KEY" in key


def test_a_model_litellm_cannot_place_is_named_where_the_model_is_called(caplog: pytest.LogCaptureFixture) -> None:
    """`NANOFLEET_LLM__MODEL=gpt4` (no provider) started fine, and every turn then failed."""
    caplog.clear()
    with caplog.at_level(logging.WARNING):
        warn_model_key(load_settings(llm={"model": "bogus-model", "api_key": "sk-x", "fallbacks": ["openai/gpt-4o"],
                                          "profiles": {"fast": {"model": "quick"}, "ok": {"model": "gpt-4o"}}},
                                     heartbeat={"model": "cheap"}))  # (it failed at every interval)
    lines = [r.getMessage() for r in caplog.records if "names no provider" in r.getMessage()]
    assert [line.split(" names")[0] for line in lines] == ["NANOFLEET_LLM__MODEL=bogus-model",
                                                          "NANOFLEET_LLM__PROFILES__FAST__MODEL=quick",
                                                          "NANOFLEET_HEARTBEAT__MODEL=cheap"]
    assert "provider/model (openai/gpt-4.1-mini" in lines[0]
