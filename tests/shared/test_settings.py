"""Settings: the contract's names, nesting, config file, and start-up refusals that name the variable."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from shared.settings import Permission, SettingsError, load_settings
from tests.support.processes import ROOT


def test_env_names_and_nesting(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("NANOFLEET_LLM__MODEL", "openai/gpt-4.1")
    monkeypatch.setenv("NANOFLEET_TOOLS__ALLOWED", '["time", "read_file"]')
    monkeypatch.setenv("NANOFLEET_PERMISSIONS__GRANTED", '["FS_READ"]')
    monkeypatch.setenv("NANOFLEET_CHANNELS__TELEGRAM__ALLOW_FROM", '["*"]')
    s = load_settings()
    assert s.llm.model == "openai/gpt-4.1"
    assert s.tools.allowed == ["time", "read_file"]
    assert s.permissions.granted == [Permission.FS_READ]
    assert s.channels.telegram.allow_from == ["*"]


@pytest.mark.parametrize(("value", "read"), [("[4242, \"alice\"]", ["4242", "alice"]), ("4242", ["4242"])])
def test_numeric_user_ids_are_read_as_the_ids_they_are(monkeypatch: pytest.MonkeyPatch, value: str,
                                                       read: list[str]) -> None:
    """Telegram's user ids are numbers: written as numbers, they are the same ids."""
    monkeypatch.setenv("NANOFLEET_CHANNELS__TELEGRAM__ALLOW_FROM", value)
    assert load_settings().channels.telegram.allow_from == read


def test_defaults_deny_everything(monkeypatch: pytest.MonkeyPatch) -> None:
    for key in list(__import__("os").environ):
        if key.startswith("NANOFLEET_"):
            monkeypatch.delenv(key)
    s = load_settings()
    assert s.tools.allowed == [] and s.permissions.granted == [] and s.api_keys == []
    assert s.channels.slack.allow_from == []


@pytest.mark.parametrize(("var", "value"), [
    ("NANOFLEET_REDIS_URL", "nope"),
    ("NANOFLEET_DATABASE_URL", "mysql://x"),
    ("NANOFLEET_PERMISSIONS__GRANTED", '["ROOT"]'),
    ("NANOFLEET_LLM__API_KEY", "changeme"),
    ("NANOFLEET_MEMORY__WINDOW", "many"),
    ("NANOFLEET_TOOLS__PROTECTED_FILES", '["../elsewhere/AGENTS.md"]'),
    ("NANOFLEET_TOOLS__PROTECTED_FILES", '["/etc/passwd"]'),
])
def test_bad_setting_names_the_variable(monkeypatch: pytest.MonkeyPatch, var: str, value: str) -> None:
    monkeypatch.setenv(var, value)
    with pytest.raises(SettingsError) as err:
        load_settings()
    assert var in str(err.value)


def test_config_file(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    path = tmp_path / "nanofleet.toml"
    path.write_text('[llm]\nmodel = "anthropic/claude-sonnet-4"\n[memory]\nwindow = 7\n')
    monkeypatch.setenv("NANOFLEET_CONFIG_FILE", str(path))
    monkeypatch.setenv("NANOFLEET_MEMORY__WINDOW", "9")  # the environment wins over the file
    s = load_settings()
    assert s.llm.model == "anthropic/claude-sonnet-4" and s.memory.window == 9


def test_missing_config_file_is_named(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("NANOFLEET_CONFIG_FILE", str(tmp_path / "absent.toml"))
    with pytest.raises(SettingsError, match="NANOFLEET_CONFIG_FILE"):
        load_settings()


def test_cli_refuses_to_start_with_a_bad_setting() -> None:
    env = {"PATH": "/usr/bin:/bin", "NANOFLEET_REDIS_URL": "nope", "LITELLM_LOCAL_MODEL_COST_MAP": "True"}
    done = subprocess.run([sys.executable, "-m", "gateway.cli", "status"], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=60)
    assert done.returncode == 2
    assert "NANOFLEET_REDIS_URL" in done.stderr and "Traceback" not in done.stderr


def test_secrets_are_collected_for_redaction(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("NANOFLEET_CHANNELS__TELEGRAM__TOKEN", "123456:telegram-secret")
    monkeypatch.setenv("NANOFLEET_API_KEYS", '["api-key-secret"]')
    assert {"123456:telegram-secret", "api-key-secret"} <= set(load_settings().secrets())


def test_mcp_server_tokens_are_secrets(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("NANOFLEET_TOOLS__MCP_SERVERS", json.dumps({
        "gh": {"command": "gh-mcp", "env": {"GITHUB_TOKEN": "ghp-env-secret"}},
        "web": {"url": "https://mcp.example/mcp?access_token=url-secret",
                "headers": {"Authorization": "Bearer hdr-secret"}},
    }))
    s = load_settings()
    secrets = set(s.secrets())
    assert {"ghp-env-secret", "Bearer hdr-secret", "https://mcp.example/mcp?access_token=url-secret"} <= secrets
    assert not any(x in repr(s) for x in ("ghp-env-secret", "hdr-secret", "url-secret"))
    assert s.tools.mcp_servers["gh"].plain_env() == {"GITHUB_TOKEN": "ghp-env-secret"}


def test_plain_variables_of_commands_and_servers_are_not_masked_in_logs(monkeypatch: pytest.MonkeyPatch) -> None:
    """Every value counted as a secret: `LOG_LEVEL=error` made every "error" in the logs "***"."""
    monkeypatch.setenv("NANOFLEET_TOOLS__MCP_SERVERS", json.dumps({
        "srv": {"command": "srv", "env": {"LOG_LEVEL": "error", "MODE": "production", "API_KEY": "short",
                                          "X": "k7Qp2Zr9", "ADMIN_PW": "hunter22", "PIN": "123456", "NAME": "linger",
                                          "GITHUB_HOST": "github.com", "PORT": "8080", "PYTHONPATH": "/app",
                                          "DATABASE_URL": "postgresql://app:pw4@db/app"},
                "headers": {"User-Agent": "nanofleet", "X-Session": "abcd", "X-Upstream": "Basic dXNlcjpwYXNz"}}}))
    monkeypatch.setenv("NANOFLEET_TOOLS__EXEC__ENV", json.dumps({"LANG": "C.UTF-8", "GH_TOKEN": "ghp-1234"}))
    secrets = set(load_settings().secrets())
    assert {"short", "k7Qp2Zr9", "abcd", "ghp-1234", "hunter22", "123456", "Basic dXNlcjpwYXNz",
            "postgresql://app:pw4@db/app"} <= secrets  # by name, a token's look, a URL's login
    assert not {"error", "production", "nanofleet", "C.UTF-8", "linger", "github.com", "8080", "/app"} & secrets


def test_variables_set_one_by_one_keep_the_case_of_their_names(monkeypatch: pytest.MonkeyPatch,
                                                                tmp_path: Path) -> None:
    """The environment's settings are read lowercased: a server got github_token, commands gh_token."""
    monkeypatch.setenv("NANOFLEET_TOOLS__MCP_SERVERS__GitHub__COMMAND", "github-mcp")
    monkeypatch.setenv("NANOFLEET_TOOLS__MCP_SERVERS__GitHub__ENV__GITHUB_TOKEN", "ghp-one-by-one")
    monkeypatch.setenv("NANOFLEET_TOOLS__EXEC__ENV__GH_TOKEN", "ghp-for-commands")
    monkeypatch.setenv("NANOFLEET_TOOLS__EXEC__ENV__http_proxy", "http://proxy:3128")
    tools = load_settings().tools
    assert tools.mcp_servers["github"].plain_env() == {"GITHUB_TOKEN": "ghp-one-by-one"}
    assert {k: v.get_secret_value() for k, v in tools.exec.env.items()} == {
        "GH_TOKEN": "ghp-for-commands", "http_proxy": "http://proxy:3128"}
    config = tmp_path / "nanofleet.toml"  # the environment wins over a file, as for every setting
    config.write_text('[tools.exec.env]\nGH_TOKEN = "from-the-file"\nLANG = "C.UTF-8"\n')
    monkeypatch.setenv("NANOFLEET_CONFIG_FILE", str(config))
    env = {k: v.get_secret_value() for k, v in load_settings().tools.exec.env.items()}
    assert env == {"GH_TOKEN": "ghp-for-commands", "http_proxy": "http://proxy:3128", "LANG": "C.UTF-8"}
    with pytest.raises(SettingsError):  # not an AttributeError of the renaming
        load_settings(tools={"mcp_servers": ["x"]})


def test_a_price_needs_both_halves(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("NANOFLEET_LLM__INPUT_COST_PER_TOKEN", "0.000001")
    with pytest.raises(SettingsError) as err:
        load_settings()
    assert "NANOFLEET_LLM" in str(err.value) and "output_cost_per_token" in str(err.value)
    monkeypatch.setenv("NANOFLEET_LLM__OUTPUT_COST_PER_TOKEN", "0.000004")
    llm = load_settings().llm
    assert (llm.input_cost_per_token, llm.output_cost_per_token) == (1e-6, 4e-6)


@pytest.mark.parametrize(("var", "value"), [
    ("NANOFLEET_DATABASE_URL", "postgresql://postgres:Secret#Hash@127.0.0.1:5432/x"),
    ("NANOFLEET_REDIS_URL", "redis://:Secret#Hash@127.0.0.1:6379/0"),
])
def test_a_hash_in_a_url_is_refused_without_repeating_it(monkeypatch: pytest.MonkeyPatch, var: str, value: str) -> None:
    """SQLAlchemy read 'Secret#Hash' as the password and printed the URL whole in errors; Redis's
    readers took 'Secret' for a port and died with a traceback showing it."""
    monkeypatch.setenv(var, value)
    with pytest.raises(SettingsError) as err:
        load_settings()
    assert f"{var}: holds a '#': percent-encode it (%23)" in str(err.value) and "Secret" not in str(err.value)


@pytest.mark.parametrize("var", ["NANOFLEET_WORKSPACE", "NANOFLEET_DATA_DIR"])
def test_an_empty_path_is_refused_not_taken_for_the_current_directory(monkeypatch: pytest.MonkeyPatch,
                                                                      var: str) -> None:
    monkeypatch.setenv(var, " ")
    with pytest.raises(SettingsError, match=f"{var}: is empty: name a directory"):
        load_settings()


def test_a_profile_without_a_model_is_refused(monkeypatch: pytest.MonkeyPatch) -> None:
    """A misspelt key inside the JSON ("modle") left the built-in default model, with no word said."""
    monkeypatch.setenv("NANOFLEET_LLM__PROFILES", '{"cheap": {"modle": "openai/gpt-4.1-nano"}}')
    with pytest.raises(SettingsError, match="NANOFLEET_LLM__PROFILES: profile 'cheap' names no model"):
        load_settings()


def test_max_tokens_must_leave_room_for_a_prompt(monkeypatch: pytest.MonkeyPatch) -> None:
    """A prompt, its history trimmed to what max_tokens left, and the answer must fit the window."""
    monkeypatch.setenv("NANOFLEET_LLM__CONTEXT_WINDOW", "8192")
    monkeypatch.setenv("NANOFLEET_LLM__MAX_TOKENS", "6145")
    with pytest.raises(SettingsError) as err:
        load_settings()
    assert "max_tokens (6145) leaves less than a quarter of context_window (8192) for the prompt" in str(err.value)
    monkeypatch.setenv("NANOFLEET_LLM__MAX_TOKENS", "6144")
    assert load_settings().llm.max_tokens == 6144


@pytest.mark.parametrize(("var", "value", "expected"), [
    ("NANOFLEET_API_KEYS", "[a-long-random-key]", "single-quote it"),  # `set -a; . ./.env` dropped the quotes
    ("NANOFLEET_API_KEYS", "a-long-random-key", "a JSON list is expected"),
    ("NANOFLEET_TOOLS__ALLOWED", '["time",]', '["time","read_file"]'),
    ("NANOFLEET_TOOLS__ALLOWED", "time,read_file", "a JSON list is expected"),
    ("NANOFLEET_CHANNELS__TELEGRAM__ALLOW_FROM", "[123]x", "a JSON list is expected"),
    ("NANOFLEET_TOOLS__MCP_SERVERS__GH__HEADERS", "{Authorization: x}", "a JSON object is expected"),
])
def test_malformed_json_names_the_exact_variable(monkeypatch: pytest.MonkeyPatch, var: str, value: str,
                                                 expected: str) -> None:
    monkeypatch.setenv("NANOFLEET_TOOLS__EXEC__ENV__GH_TOKEN", "[not json, and need not be]")  # a mapping's value
    monkeypatch.setenv(var, value)
    with pytest.raises(SettingsError) as err:
        load_settings()
    lines = str(err.value).splitlines()[1:]
    assert len(lines) == 1 and lines[0].strip().startswith(f"{var}: not valid JSON (") and expected in lines[0]
    assert "a-long-random-key]" not in lines[0]  # a secret's value is not repeated


def test_json_cut_short_is_not_said_to_have_lost_its_quotes(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("NANOFLEET_CHANNELS__TELEGRAM__ALLOW_FROM", "[1,")
    with pytest.raises(SettingsError) as err:
        load_settings()
    assert "Expecting value" in str(err.value) and "quotes are gone" not in str(err.value)


@pytest.mark.parametrize("value", ["[a-long-random-key]", '["time",]'])
def test_cli_names_a_malformed_json_variable_without_a_traceback(value: str) -> None:
    env = {"PATH": "/usr/bin:/bin", "NANOFLEET_TOOLS__ALLOWED": value, "LITELLM_LOCAL_MODEL_COST_MAP": "True"}
    for command in (["status"], ["agent", "-m", "hi"]):
        done = subprocess.run([sys.executable, "-m", "gateway.cli", *command], cwd=ROOT, env=env,
                              capture_output=True, text=True, timeout=60)
        assert done.returncode == 2, done.stderr
        assert "NANOFLEET_TOOLS__ALLOWED: not valid JSON" in done.stderr and "Traceback" not in done.stderr


def test_malformed_config_file_is_named_with_the_parsers_message(monkeypatch: pytest.MonkeyPatch,
                                                                 tmp_path: Path) -> None:
    path = tmp_path / "nanofleet.toml"
    path.write_text('[tools]\nallowed = ["time"\n')
    monkeypatch.setenv("NANOFLEET_CONFIG_FILE", str(path))
    with pytest.raises(SettingsError) as err:
        load_settings()
    assert f"NANOFLEET_CONFIG_FILE: {path}" in str(err.value) and "Unclosed array" in str(err.value)


def test_a_bad_value_in_the_config_file_is_named_by_its_key_there(monkeypatch: pytest.MonkeyPatch,
                                                                   tmp_path: Path) -> None:
    """Not as a variable the user never set; one the environment sets is still named as such."""
    path = tmp_path / "nanofleet.toml"
    path.write_text('api_keys = "k-0123456789"\n[tools]\nallowed = ["time", 3]\n[memory]\nwindow = "many"\n')
    monkeypatch.setenv("NANOFLEET_CONFIG_FILE", str(path))
    monkeypatch.setenv("NANOFLEET_MEMORY__WINDOW", "lots")
    monkeypatch.setenv("NANOFLEET_LLM__INPUT_COST_PER_TOKEN", "0.1")  # refused as a group: [llm] is not in the file
    with pytest.raises(SettingsError) as err:
        load_settings()
    lines = str(err.value).splitlines()[1:]
    assert sorted(line.strip().split(": ")[0] for line in lines) == sorted([
        f"api_keys in {path}", f"tools.allowed[2] in {path}", "NANOFLEET_MEMORY__WINDOW", "NANOFLEET_LLM"]), lines


def test_a_list_item_is_named_by_its_position_not_as_a_variable(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("NANOFLEET_PERMISSIONS__GRANTED", '["FS_READ", "ROOT"]')
    with pytest.raises(SettingsError) as err:
        load_settings()
    assert "NANOFLEET_PERMISSIONS__GRANTED (item 2): " in str(err.value)
    assert "GRANTED__1" not in str(err.value)


@pytest.mark.parametrize("scheme", ["postgres", "postgresql", "postgresql+psycopg"])
def test_postgres_urls_as_hosts_write_them_are_accepted(monkeypatch: pytest.MonkeyPatch, scheme: str) -> None:
    monkeypatch.setenv("NANOFLEET_DATABASE_URL", f"{scheme}://u:p@db.example:5432/app?sslmode=require")
    assert load_settings().database_url == "postgresql+psycopg://u:p@db.example:5432/app?sslmode=require"


def test_a_refused_database_url_says_what_is_accepted(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("NANOFLEET_DATABASE_URL", "mysql://u@db/app")
    with pytest.raises(SettingsError) as err:
        load_settings()
    assert all(s in str(err.value) for s in ("postgresql+psycopg://", "postgresql://", "postgres://"))


@pytest.mark.parametrize("secret", ["bad secret!", "a" * 257, "", "tøken"])
def test_telegram_webhook_secret_outside_its_alphabet_is_refused(monkeypatch: pytest.MonkeyPatch,
                                                                 secret: str) -> None:
    monkeypatch.setenv("NANOFLEET_CHANNELS__TELEGRAM__WEBHOOK_SECRET", secret)
    with pytest.raises(SettingsError) as err:
        load_settings()
    assert "NANOFLEET_CHANNELS__TELEGRAM__WEBHOOK_SECRET: " in str(err.value) and "A-Z a-z 0-9 _ -" in str(err.value)
    monkeypatch.setenv("NANOFLEET_CHANNELS__TELEGRAM__WEBHOOK_SECRET", "Ok_secret-1" * 20)
    assert load_settings().channels.telegram.webhook_secret is not None


@pytest.mark.parametrize("key", ["111111111111111111", "ab" * 31, "zz" * 32, "ab" * 33])
def test_a_discord_public_key_that_is_none_is_refused(monkeypatch: pytest.MonkeyPatch, key: str) -> None:
    """The application id pasted as the key made every request a forgery (401), with nothing said."""
    monkeypatch.setenv("NANOFLEET_CHANNELS__DISCORD__PUBLIC_KEY", key)
    with pytest.raises(SettingsError) as err:
        load_settings()
    assert "NANOFLEET_CHANNELS__DISCORD__PUBLIC_KEY: " in str(err.value) and "64 hexadecimal digits" in str(err.value)
    monkeypatch.setenv("NANOFLEET_CHANNELS__DISCORD__PUBLIC_KEY", f" {'aB' * 32}\n")
    assert load_settings().channels.discord.public_key == "aB" * 32


def test_passwords_in_the_database_and_redis_urls_are_secrets(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("NANOFLEET_DATABASE_URL", "postgresql+psycopg://app:db%40secret@db:5432/nanofleet")
    monkeypatch.setenv("NANOFLEET_REDIS_URL", "redis://:redis-secret@redis:6379/0")
    assert {"db%40secret", "db@secret", "redis-secret"} <= set(load_settings().secrets())


@pytest.mark.parametrize("url", [
    "rediss://cache.example.com:6380/0",  # TLS, the certificate verified (shared.broker)
    "rediss://:secret@cache.example.com:6380/0?ssl_cert_reqs=none",
    "rediss://cache.example.com/0?ssl_cert_reqs=required&ssl_ca_certs=/etc/ssl/redis-ca.pem",
    "unix:///run/redis/redis.sock",
    "unix://:secret@/run/redis/redis.sock?db=2",
])
def test_redis_urls_the_workers_can_use(monkeypatch: pytest.MonkeyPatch, url: str) -> None:
    monkeypatch.setenv("NANOFLEET_REDIS_URL", url)
    assert load_settings().redis_url == url


@pytest.mark.parametrize(("url", "says"), [
    ("rediss://cache.example.com/0?ssl_cert_reqs=maybe", "ssl_cert_reqs must be required"),
    ("rediss://cache.example.com/0?ssl_cert_reqs=CERT_NONE", "ssl_cert_reqs must be required"),  # Celery's word
    ("redis://cache.example.com/0?ssl_cert_reqs=none", "rediss:// URL only"),
    ("unix:///run/redis.sock?ssl_ca_certs=/ca.pem", "rediss:// URL only"),
    ("unix://", "names the socket's path"),
    ("redis+socket:///run/redis.sock", "unix:///path/to/redis.sock"),
])
def test_redis_urls_the_workers_cannot_use_are_refused(monkeypatch: pytest.MonkeyPatch, url: str, says: str) -> None:
    """Refused at start with the form to use, instead of a worker that dies later (or runs without TLS)."""
    monkeypatch.setenv("NANOFLEET_REDIS_URL", url)
    with pytest.raises(SettingsError) as err:
        load_settings()
    assert "NANOFLEET_REDIS_URL" in str(err.value) and says in str(err.value)


@pytest.mark.parametrize(("var", "url"), [
    ("NANOFLEET_DATABASE_URL", "postgresql+psycopg://nanofleet:nanofleet@postgres:5432/nanofleet"),
    ("NANOFLEET_REDIS_URL", "redis://:nanofleet@redis:6379/0"),
    ("NANOFLEET_REDIS_URL", "redis://:ChangeMe@redis:6379/0"),
])
def test_a_password_from_an_example_is_refused(monkeypatch: pytest.MonkeyPatch, var: str, url: str) -> None:
    """The compose file's old default: anyone can read it (the exec tool's commands share Redis's network),
    and masked in the logs it turned every line into "Task ***.agent.step[...] received"."""
    monkeypatch.setenv(var, url)
    with pytest.raises(SettingsError) as err:
        load_settings()
    assert f"{var}: " in str(err.value) and "an example anyone can read" in str(err.value)
    assert ("POSTGRES_PASSWORD" if "DATABASE" in var else "REDIS_PASSWORD") in str(err.value)


def test_the_database_pool_is_set_beside_the_database_url(monkeypatch: pytest.MonkeyPatch) -> None:
    """NANOFLEET_DATABASE_URL stays as it is; the pool's sizes are NANOFLEET_DATABASE__*."""
    monkeypatch.setenv("NANOFLEET_DATABASE_URL", "postgresql+psycopg://app@db.internal:5432/nf")
    monkeypatch.setenv("NANOFLEET_DATABASE__POOL_SIZE", "5")
    monkeypatch.setenv("NANOFLEET_DATABASE__MAX_OVERFLOW", "0")
    s = load_settings()
    assert s.database_url == "postgresql+psycopg://app@db.internal:5432/nf"
    assert (s.database.pool_size, s.database.max_overflow) == (5, 0)
    monkeypatch.setenv("NANOFLEET_DATABASE__POOL_SIZE", "0")
    with pytest.raises(SettingsError, match="NANOFLEET_DATABASE__POOL_SIZE"):
        load_settings()


def test_the_log_level_is_checked_with_the_other_settings(monkeypatch: pytest.MonkeyPatch) -> None:
    """A level logging does not know failed every process as it started, with a traceback (`up` then
    started them again and again)."""
    monkeypatch.setenv("NANOFLEET_LOG_LEVEL", "bogus")
    with pytest.raises(SettingsError) as err:
        load_settings()
    assert "NANOFLEET_LOG_LEVEL" in str(err.value) and "DEBUG, INFO, WARNING" in str(err.value)
    monkeypatch.setenv("NANOFLEET_LOG_LEVEL", "debug")
    assert load_settings().log_level == "DEBUG"


@pytest.mark.parametrize(("var", "value"), [
    ("NANOFLEET_MEMORY__WINDOW", "-1"),  # every prompt's query failed: LIMIT must not be negative
    ("NANOFLEET_MEMORY__COMPACT_AFTER", "0"),
    ("NANOFLEET_LLM__MAX_TOKENS", "0"),
    ("NANOFLEET_RUNTIME__LEASE_SECONDS", "0"),
    ("NANOFLEET_CHANNELS__DELIVERY__MAX_ATTEMPTS", "0"),
])
def test_a_number_out_of_range_stops_the_start_naming_its_variable(monkeypatch: pytest.MonkeyPatch, var: str,
                                                                   value: str) -> None:
    monkeypatch.setenv(var, value)
    with pytest.raises(SettingsError) as err:
        load_settings()
    assert var in str(err.value) and "greater than" in str(err.value)
