"""The deployment files: docker/compose.yml, docker/entrypoint.sh, docker/Dockerfile, .env.example.

The compose checks run twice: on `docker compose config --format json` when the compose plugin is
installed (skipped otherwise), and on a small pure-Python rendering of the same file (YAML anchors
and merge keys, ${VAR:-default}-style interpolation with an empty environment), so they run on
every machine. The .env.example checks tie every variable it names to a real Settings field, every
Settings field to a line in it, and every default it shows to the one in shared/settings.py.
"""

from __future__ import annotations

import functools
import json
import os
import re
import shutil
import subprocess
import sys
import time
import types
import typing
from pathlib import Path
from typing import Any, get_args, get_origin

import pytest
import yaml
from pydantic import BaseModel, SecretStr

from gateway.cli import POOLS
from shared.settings import CONFIG_FILE_ENV, SHIPPED_PASSWORDS, LLMSettings, Settings, SettingsError, load_settings

ROOT = Path(__file__).resolve().parents[2]
COMPOSE = ROOT / "docker" / "compose.yml"
ENTRYPOINT = ROOT / "docker" / "entrypoint.sh"
DOCKERFILE = ROOT / "docker" / "Dockerfile"
ENV_EXAMPLE = ROOT / ".env.example"

SERVICES = {
    "redis",
    "postgres",
    "migrate",
    "gateway",
    "worker-agent",
    "worker-tools",
    "worker-subagents",
    "worker-outbound",
    "beat",
    "flower",
}
BACKING = {"redis", "postgres"}
# Variables docker/compose.yml (not nanofleet) reads, and the config file pointer.
NOT_SETTINGS = {"NANOFLEET_PORT", CONFIG_FILE_ENV}
# Interpolated by compose: unset them so the rendering shows the defaults.
_COMPOSE_VARS = re.compile(r"^(POSTGRES_|REDIS_|FLOWER_|NANOFLEET_|COMPOSE_)")
# The variables compose requires (no default password: anyone can read the file); the renderings
# set them, as .env does.
REQUIRED = {"POSTGRES_PASSWORD": "pg-test-password", "REDIS_PASSWORD": "redis-test-password",
            "FLOWER_BASIC_AUTH": "admin:flower-test-password"}


# --------------------------------------------------------------------------- rendering compose

_INTERP = re.compile(
    r"\$(?:(?P<esc>\$)|\{(?P<braced>[^}]*)\}|(?P<named>[A-Za-z_][A-Za-z0-9_]*))"
)
_BRACED = re.compile(
    r"(?P<name>[A-Za-z_][A-Za-z0-9_]*)(?:(?P<op>:?[-?+])(?P<arg>.*))?", re.DOTALL
)


def _interpolate(value: str, env: dict[str, str]) -> str:
    """Compose's interpolation: $$, $VAR, ${VAR}, ${VAR:-d}, ${VAR-d}, ${VAR:?e}, ${VAR?e}, ${VAR:+r}."""

    def sub(m: re.Match[str]) -> str:
        if m["esc"]:
            return "$"
        if m["named"]:
            return env.get(m["named"], "")
        b = _BRACED.fullmatch(m["braced"])
        if b is None:
            raise ValueError(f"invalid interpolation: ${{{m['braced']}}}")
        name, op, arg = b["name"], b["op"], b["arg"]
        val = env.get(name)
        if op is None:
            return val or ""
        missing = val is None or (op.startswith(":") and val == "")
        if op.endswith("-"):
            return arg if missing else str(val)
        if op.endswith("?"):
            if missing:
                raise ValueError(f"required variable {name} is missing a value: {arg}")
            return str(val)
        return "" if missing else arg  # "+"

    return _INTERP.sub(sub, value)


def _walk(node: Any, env: dict[str, str]) -> Any:
    if isinstance(node, str):
        return _interpolate(node, env)
    if isinstance(node, dict):
        return {k: _walk(v, env) for k, v in node.items()}
    if isinstance(node, list):
        return [_walk(v, env) for v in node]
    return node


def _render_python(env: dict[str, str] = REQUIRED) -> dict[str, Any]:
    raw = yaml.safe_load(
        COMPOSE.read_text()
    )  # SafeLoader resolves anchors and << merge keys
    rendered = _walk(raw, env=env)
    return {k: v for k, v in rendered.items() if not k.startswith("x-")}


@functools.cache
def _docker_compose_unavailable() -> str | None:
    """Why `docker compose` cannot run here, or None when it can."""
    docker = shutil.which("docker")
    if docker is None:
        return "the docker binary is not installed"
    probe = subprocess.run(
        [docker, "compose", "version"],
        capture_output=True,
        text=True,
        timeout=30,
        check=False,
    )
    if probe.returncode != 0:
        first = (probe.stderr.strip().splitlines() or ["no output"])[0]
        return f"the docker compose plugin is not installed ({first})"
    return None


def _render_docker() -> dict[str, Any]:
    reason = _docker_compose_unavailable()
    if reason:
        pytest.skip(reason)
    env = {k: v for k, v in os.environ.items() if not _COMPOSE_VARS.match(k)} | REQUIRED
    out = subprocess.run(
        ["docker", "compose", "-f", str(COMPOSE), "config", "--format", "json"],
        capture_output=True,
        text=True,
        timeout=60,
        cwd=ROOT,
        env=env,
        check=False,
    )
    assert out.returncode == 0, f"docker compose config failed:\n{out.stderr}"
    return json.loads(out.stdout)


@pytest.fixture(scope="module", params=["docker-compose-config", "python-render"])
def compose(request: pytest.FixtureRequest) -> dict[str, Any]:
    return (
        _render_docker()
        if request.param == "docker-compose-config"
        else _render_python()
    )


def _app_services(compose: dict[str, Any]) -> dict[str, dict[str, Any]]:
    """The services that run nanofleet itself (the image's other use, Flower, needs only Redis)."""
    return {
        n: s
        for n, s in compose["services"].items()
        if s.get("image") == "nanofleet:latest" and n != "flower"
    }


def _cmd(service: dict[str, Any]) -> str:
    command = service.get("command") or []
    return " ".join(command) if isinstance(command, list) else str(command)


def _depends(service: dict[str, Any]) -> dict[str, str]:
    deps = service.get("depends_on") or {}
    if isinstance(deps, list):
        return {d: "service_started" for d in deps}
    return {
        name: spec.get("condition", "service_started") for name, spec in deps.items()
    }


# --------------------------------------------------------------------------- compose checks


def test_every_service_is_defined(compose: dict[str, Any]) -> None:
    assert set(compose["services"]) >= SERVICES, SERVICES - set(compose["services"])
    assert set(_app_services(compose)) == SERVICES - BACKING - {"flower"}
    assert compose["services"]["flower"]["image"] == "nanofleet:latest"


def test_no_container_names_so_services_scale(compose: dict[str, Any]) -> None:
    named = [n for n, s in compose["services"].items() if "container_name" in s]
    assert named == []


def test_app_services_wait_for_healthy_backends_and_migrations(
    compose: dict[str, Any],
) -> None:
    for name, service in _app_services(compose).items():
        deps = _depends(service)
        assert deps.get("postgres") == "service_healthy", (name, deps)
        if name == "migrate":
            continue
        assert deps.get("redis") == "service_healthy", (name, deps)
        assert deps.get("migrate") == "service_completed_successfully", (name, deps)


def test_backends_have_healthchecks(compose: dict[str, Any]) -> None:
    services = compose["services"]
    assert "redis-cli" in json.dumps(services["redis"]["healthcheck"]["test"])
    assert "pg_isready" in json.dumps(services["postgres"]["healthcheck"]["test"])
    assert "/healthz" in json.dumps(services["gateway"]["healthcheck"]["test"])


def _run_healthcheck(test: list[str], data_dir: Path) -> int:
    """Run a CMD healthcheck here, with this interpreter for `python`, as the container's would."""
    assert test[0] == "CMD" and test[1] == "python", test
    env = {**os.environ, "NANOFLEET_DATA_DIR": str(data_dir)}
    return subprocess.run([sys.executable, *test[2:]], env=env, timeout=30, check=False).returncode


def test_every_worker_is_healthy_while_its_heartbeat_touches_the_liveness_file(
        compose: dict[str, Any], tmp_path: Path) -> None:
    """A worker whose broker connection or event loop is gone stops touching the file (workers/health.py):
    its container turns unhealthy; no `celery inspect`, which would load the app at every check."""
    from workers.health import ALIVE_FILE

    workers = {n: s for n, s in compose["services"].items() if n.startswith("worker-")}
    tests = {json.dumps(s["healthcheck"]["test"]) for s in workers.values()}
    assert len(tests) == 1 and "celery" not in tests.copy().pop()
    test = workers["worker-agent"]["healthcheck"]["test"]
    alive = tmp_path / ALIVE_FILE
    assert _run_healthcheck(test, tmp_path) == 1  # not started yet (start_period covers it)
    alive.touch()
    assert _run_healthcheck(test, tmp_path) == 0
    old = time.time() - 120
    os.utime(alive, (old, old))
    assert _run_healthcheck(test, tmp_path) == 1
    for name, service in workers.items():
        check = service["healthcheck"]
        assert _seconds(check["start_period"]) >= 30 and int(check["retries"]) >= 2, name


def test_beat_is_healthy_while_its_scheduler_touches_its_liveness_file(compose: dict[str, Any],
                                                                       tmp_path: Path) -> None:
    """Beat had no healthcheck: one stuck showed as running for good (workers/beat.py touches the file)."""
    from shared.constants import BEAT_ALIVE_FILE

    check = compose["services"]["beat"]["healthcheck"]
    assert _run_healthcheck(check["test"], tmp_path) == 1
    alive = tmp_path / BEAT_ALIVE_FILE
    alive.touch()
    assert _run_healthcheck(check["test"], tmp_path) == 0
    old = time.time() - 120
    os.utime(alive, (old, old))
    assert _run_healthcheck(check["test"], tmp_path) == 1
    assert _seconds(check["start_period"]) >= 30 and int(check["retries"]) >= 2


def test_redis_is_durable_and_never_evicts(compose: dict[str, Any]) -> None:
    command = _cmd(compose["services"]["redis"])
    assert "--appendonly yes" in command
    assert "noeviction" in command
    assert "--maxmemory 1gb" in command  # at the cap it refuses writes instead of growing until killed


def test_every_service_rotates_its_logs(compose: dict[str, Any]) -> None:
    """Docker's json-file driver keeps a container's whole log unless told a size."""
    for name, service in compose["services"].items():
        logging = service.get("logging") or {}
        assert logging.get("driver") == "json-file", name
        assert logging.get("options") == {"max-size": "50m", "max-file": "5"}, name


@pytest.mark.parametrize("missing", sorted(REQUIRED))
def test_the_passwords_have_no_default(missing: str) -> None:
    """Compose stops and names the password .env lacks: a default would be readable by anyone (and the
    old one, "nanofleet", masked in the logs, made every line read "Task ***.agent.step")."""
    env = {k: v for k, v in REQUIRED.items() if k != missing}
    with pytest.raises(ValueError, match=f"required variable {missing} is missing a value: set {missing} in .env"):
        _render_python(env)
    with pytest.raises(ValueError, match=missing):
        _render_python({**env, missing: ""})  # .env.example's empty line
    assert re.search(rf"^{missing}=$", ENV_EXAMPLE.read_text(), re.MULTILINE)


def _networks(service: dict[str, Any]) -> set[str]:
    """The networks a service joins (compose puts one that names none on `default`)."""
    return set(service.get("networks") or ["default"])


def test_flower_shares_no_network_with_the_workers(compose: dict[str, Any]) -> None:
    """exec's commands run in worker-tools: they must not reach Flower's API (it revokes tasks and shuts
    workers down, behind a password only). Flower reaches Redis on a network of its own."""
    services = compose["services"]
    flower = _networks(services["flower"])
    assert flower and flower <= _networks(services["redis"])
    for name, service in services.items():
        if name not in ("flower", "redis"):
            assert not flower & _networks(service), name
    for name in ("worker-agent", "worker-tools", "worker-subagents", "worker-outbound", "beat", "gateway", "migrate"):
        assert _networks(services[name]) & _networks(services["redis"]), name
        assert _networks(services[name]) & _networks(services["postgres"]), name
    declared = set(compose.get("networks") or {}) | {"default"}
    assert {n for s in services.values() for n in _networks(s)} <= declared


def test_migrate_runs_once(compose: dict[str, Any]) -> None:
    migrate = compose["services"]["migrate"]
    assert _cmd(migrate) == "migrate"
    assert migrate.get("restart") == "no"
    for name, service in _app_services(compose).items():
        if name != "migrate":
            assert service.get("restart") == "unless-stopped", name


def test_beat_has_exactly_one_replica(compose: dict[str, Any]) -> None:
    beat = compose["services"]["beat"]
    assert _cmd(beat) == "beat"
    assert beat["deploy"]["replicas"] == 1


def test_workers_cover_every_queue_and_stop_gracefully(compose: dict[str, Any]) -> None:
    from shared.constants import QUEUES

    workers = {n: s for n, s in compose["services"].items() if n.startswith("worker-")}
    assert set(workers) == {
        "worker-agent",
        "worker-tools",
        "worker-subagents",
        "worker-outbound",
    }
    served: set[str] = set()
    for name, service in workers.items():
        argv = service["command"]
        assert argv[0] == "worker", name
        served |= set(argv[argv.index("--queues") + 1].split(","))
        assert argv[argv.index("--pool") + 1] in POOLS, name
        assert int(argv[argv.index("--concurrency") + 1]) > 0, name
        assert service.get("stop_grace_period"), f"{name} has no stop_grace_period"
        assert service.get("stop_signal") == "SIGTERM", name
    assert served == set(QUEUES)


_DURATION = re.compile(r"(\d+(?:\.\d+)?)(h|ms|m|s|us)")
_UNIT_SECONDS = {"h": 3600.0, "m": 60.0, "s": 1.0, "ms": 1e-3, "us": 1e-6}


def _seconds(duration: str) -> float:
    """A compose duration ("150s", or "2m30s" as `docker compose config` writes it) in seconds."""
    parts = _DURATION.findall(duration)
    assert parts and "".join(n + u for n, u in parts) == duration, f"not a duration: {duration!r}"
    return sum(float(n) * _UNIT_SECONDS[u] for n, u in parts)


def test_a_worker_stop_waits_out_an_llm_call(compose: dict[str, Any]) -> None:
    """`docker compose stop` sends SIGTERM (Celery's warm shutdown: running steps finish), then kills
    after stop_grace_period: a worker must get longer than one LLM call at the default timeout, or
    every stop cuts off the calls in flight."""
    workers = {n: s for n, s in compose["services"].items() if n.startswith("worker-")}
    assert workers
    for name, service in workers.items():
        assert _seconds(service["stop_grace_period"]) > LLMSettings().timeout, name


def test_only_the_tools_worker_runs_without_tini(compose: dict[str, Any]) -> None:
    """tini would hold every secret readable by exec's commands (same user); elsewhere it forwards
    signals and reaps."""
    inits = {name: service.get("init") for name, service in _app_services(compose).items()}
    assert inits.pop("worker-tools") is False
    assert all(inits.values()), inits
    assert int(compose["services"]["worker-tools"]["pids_limit"]) == 512  # where commands run: bounded


def test_env_file_is_optional(compose: dict[str, Any]) -> None:
    for name, service in _app_services(compose).items():
        entries = service.get("env_file") or []
        assert entries, f"{name} does not read .env"
        for entry in entries:
            assert isinstance(entry, dict) and entry.get("required") is False, (
                name,
                entry,
            )


def test_app_services_reach_backends_by_service_name(compose: dict[str, Any]) -> None:
    for name, service in _app_services(compose).items():
        env = service["environment"]
        assert env["NANOFLEET_DATABASE_URL"] == (
            "postgresql+psycopg://nanofleet:pg-test-password@postgres:5432/nanofleet"
        ), name
        assert env["NANOFLEET_REDIS_URL"] == "redis://:redis-test-password@redis:6379/0", name
        assert "/data/workspace" in json.dumps(service["volumes"]), name



def test_flower_gets_the_broker_and_nothing_else(compose: dict[str, Any]) -> None:
    """Flower inherited the app's whole .env (model keys, platform tokens), the database's URL and
    the workspace volume, though it only reads Redis."""
    flower = compose["services"]["flower"]
    assert flower["environment"] == {"NANOFLEET_REDIS_URL": "redis://:redis-test-password@redis:6379/0",
                                     "FLOWER_BASIC_AUTH": "admin:flower-test-password"}
    assert not flower.get("env_file") and not flower.get("volumes")
    assert _depends(flower) == {"redis": "service_healthy"} and flower.get("init") is True
    assert flower.get("restart") == "unless-stopped"


def test_required_variable_without_value_fails_rendering() -> None:
    """The renderer used above is strict where compose is, so a `:?` would not slip through."""
    with pytest.raises(ValueError, match="FLOWER_BASIC_AUTH"):
        _interpolate("${FLOWER_BASIC_AUTH:?set it}", {})
    assert (
        _interpolate("a$$b ${X:-d} ${X-e} ${Y:+r}", {"X": "", "Y": "1"}) == "a$b d  r"
    )


# --------------------------------------------------------------------------- entrypoint


@pytest.fixture()
def fake_bin(tmp_path: Path) -> Path:
    """`nanofleet` and `celery` stand-ins that print how they were called."""
    for exe in ("nanofleet", "celery"):
        path = tmp_path / exe
        path.write_text(f'#!/bin/sh\necho {exe} "$@"\n')
        path.chmod(0o755)
    return tmp_path


def _entry(fake_bin: Path, *args: str, **env: str) -> subprocess.CompletedProcess[str]:
    full_env = {"PATH": f"{fake_bin}:/usr/bin:/bin", **env}
    return subprocess.run(
        ["sh", str(ENTRYPOINT), *args],
        capture_output=True,
        text=True,
        env=full_env,
        timeout=30,
        check=False,
    )


def test_entrypoint_dispatches_roles(fake_bin: Path) -> None:
    assert _entry(fake_bin).stdout.strip() == "nanofleet gateway --host 0.0.0.0"
    out = _entry(fake_bin, "worker", "--queues", "agent", "--pool", "threads")
    assert out.stdout.strip() == "nanofleet worker --queues agent --pool threads"
    out = _entry(fake_bin, "flower", "--url_prefix=flower", FLOWER_BASIC_AUTH="u:p")
    assert (
        out.stdout.strip()
        == "celery -A workers.flower:app flower --port=5555 --url_prefix=flower"
    )


@pytest.mark.parametrize("auth", [None, "", "admin", "admin:", "admin:  ", ":secret-enough", "ops:s3cret,admin:"])
def test_entrypoint_refuses_flower_without_auth(fake_bin: Path, auth: str | None) -> None:
    out = _entry(fake_bin, "flower", **({} if auth is None else {"FLOWER_BASIC_AUTH": auth}))
    assert out.returncode != 0
    assert "FLOWER_BASIC_AUTH" in out.stderr and "refusing to start Flower" in out.stderr
    assert out.stdout == ""


@pytest.mark.parametrize("password", sorted(SHIPPED_PASSWORDS | {"change-me-now", "Change-Me-Now", " changeme "}))
def test_entrypoint_refuses_flower_with_a_password_from_an_example(fake_bin: Path, password: str) -> None:
    """As the database and Redis passwords are (shared/settings.py): anyone can read the example's."""
    for auth in (f"admin:{password}", f"ops:a-real-one,admin:{password}"):
        out = _entry(fake_bin, "flower", FLOWER_BASIC_AUTH=auth)
        assert out.returncode != 0 and out.stdout == "", auth
        assert "FLOWER_BASIC_AUTH" in out.stderr and "example" in out.stderr, out.stderr
    out = _entry(fake_bin, "flower", FLOWER_BASIC_AUTH="admin:a-real-one,ops:another-one")
    assert out.stdout.strip() == "celery -A workers.flower:app flower --port=5555", out.stderr


def test_dockerfile_contract() -> None:
    text = DOCKERFILE.read_text()
    assert re.search(
        r"^FROM python:3\.11-slim|^ARG PYTHON_IMAGE=python:3\.11-slim",
        text,
        re.MULTILINE,
    )
    assert "uv sync --frozen --no-dev --no-install-project" in text
    assert 'ENTRYPOINT ["/app/docker/entrypoint.sh"]' in text
    # the code stays root's: exec's commands run as nanofleet and must not rewrite what workers import
    assert re.search(r"^COPY --from=builder /app/\.venv /app/\.venv$", text, re.MULTILINE)
    assert "chown -R nanofleet:nanofleet /data\n" in text
    assert 'CMD ["gateway", "--host", "0.0.0.0"]' in text
    assert re.search(r"^USER nanofleet", text, re.MULTILINE)
    assert "10001" in text
    for env in (
        "LITELLM_LOCAL_MODEL_COST_MAP=True",
        "PYTHONUNBUFFERED=1",
        "NANOFLEET_DATA_DIR=/data",
        "NANOFLEET_WORKSPACE=/data/workspace",
    ):
        assert env in text, env
    assert os.access(ENTRYPOINT, os.X_OK), "docker/entrypoint.sh must be executable"


# --------------------------------------------------------------------------- .env.example

_NAME = re.compile(r"\bNANOFLEET_[A-Z0-9][A-Z0-9_]*")
_DEFAULT_LINE = re.compile(r"^# (NANOFLEET_[A-Z0-9_]+)=(.*)$")
_EXAMPLE_LINE = re.compile(
    r"^#\s+e\.g\. (NANOFLEET_[A-Z0-9_]+)=(.*?)(?:\s{2,}\(.*\))?$"
)


def _unwrap(tp: Any) -> Any:
    """X | None -> X."""
    if get_origin(tp) in (typing.Union, types.UnionType):
        args = [a for a in get_args(tp) if a is not type(None)]
        if len(args) == 1:
            return args[0]
    return tp


def _is_model(tp: Any) -> bool:
    return isinstance(tp, type) and issubclass(tp, BaseModel)


def _maps_to_setting(var: str) -> bool:
    """True when NANOFLEET_A__B__C names a field path of Settings (dicts take any key)."""
    parts = var.removeprefix("NANOFLEET_").lower().split("__")
    tp: Any = Settings
    for part in parts:
        tp = _unwrap(tp)
        if _is_model(tp):
            field = tp.model_fields.get(part)
            if field is None:
                return False
            tp = field.annotation
        elif get_origin(tp) is dict:
            tp = get_args(tp)[1]
        else:
            return False
    return True


def _leaf_vars(
    model: type[BaseModel] = Settings, prefix: str = "NANOFLEET_"
) -> set[str]:
    found: set[str] = set()
    for name, field in model.model_fields.items():
        tp = _unwrap(field.annotation)
        var = prefix + name.upper()
        if _is_model(tp):
            found |= _leaf_vars(tp, var + "__")
        else:
            found.add(var)
    return found


def _get(settings: Settings, var: str) -> Any:
    obj: Any = settings
    for part in var.removeprefix("NANOFLEET_").lower().split("__"):
        obj = obj[part] if isinstance(obj, dict) else getattr(obj, part)
    return obj


@pytest.fixture()
def clean_env(monkeypatch: pytest.MonkeyPatch) -> pytest.MonkeyPatch:
    for key in list(os.environ):
        if key.startswith("NANOFLEET_"):
            monkeypatch.delenv(key)
    return monkeypatch


def _env_lines() -> list[str]:
    return ENV_EXAMPLE.read_text().splitlines()


def test_env_example_names_only_real_settings() -> None:
    names = set(_NAME.findall(ENV_EXAMPLE.read_text()))
    raw = yaml.safe_load(COMPOSE.read_text())
    names |= {k for k in raw["x-app-env"] if k.startswith("NANOFLEET_")}
    unknown = sorted(n for n in names - NOT_SETTINGS if not _maps_to_setting(n))
    assert unknown == [], f"not a Settings field: {unknown}"


def test_env_example_documents_every_setting() -> None:
    documented = {
        m.group(1) for line in _env_lines() if (m := _DEFAULT_LINE.match(line))
    }
    missing = sorted(_leaf_vars() - documented)
    assert missing == [], f"add to .env.example: {missing}"


def test_env_example_shows_the_real_defaults(clean_env: pytest.MonkeyPatch) -> None:
    default = load_settings()
    wrong = []
    for line in _env_lines():
        m = _DEFAULT_LINE.match(line)
        if not m or not m.group(2):  # empty: unset (None or a secret)
            continue
        var, value = m.groups()
        with pytest.MonkeyPatch.context() as mp:
            mp.setenv(var, value)
            got = _get(load_settings(), var)
        if got != _get(default, var):
            wrong.append(f"{var}={value} but the default is {_get(default, var)!r}")
    assert wrong == [], "\n".join(wrong)


def test_env_example_unset_lines_are_really_unset_by_default(
    clean_env: pytest.MonkeyPatch,
) -> None:
    default = load_settings()
    for line in _env_lines():
        m = _DEFAULT_LINE.match(line)
        if m and not m.group(2):
            assert _get(default, m.group(1)) in (None, ""), m.group(1)


def test_env_example_examples_are_valid(clean_env: pytest.MonkeyPatch) -> None:
    examples = [m.groups() for line in _env_lines() if (m := _EXAMPLE_LINE.match(line))]
    assert len(examples) >= 5
    for var, value in examples:
        with pytest.MonkeyPatch.context() as mp:
            mp.setenv(var, value)
            try:
                settings = load_settings()
            except SettingsError as err:
                pytest.fail(f"{var}={value}: {err}")
            got = _get(settings, var)
            if isinstance(got, SecretStr):
                got = got.get_secret_value()
            if isinstance(got, str):
                assert got == value, var


def test_env_example_active_lines_are_compose_only() -> None:
    """Uncommented NANOFLEET_ lines would override settings for every user who copies the file."""
    active = [
        line.split("=", 1)[0] for line in _env_lines() if re.match(r"^[A-Z_]+=", line)
    ]
    assert {
        "POSTGRES_USER",
        "POSTGRES_PASSWORD",
        "POSTGRES_DB",
        "FLOWER_BASIC_AUTH",
        "NANOFLEET_PORT",
    } <= set(active)
    overriding = [
        a for a in active if a.startswith("NANOFLEET_") and a not in NOT_SETTINGS
    ]
    assert overriding == [], f"comment these out in .env.example: {overriding}"


def test_redis_asks_for_the_password_the_app_services_use(compose: dict[str, Any]) -> None:
    """The exec tool's commands share the workers' network: without a password they could read the
    event streams of every conversation and write broker messages (security review)."""
    redis_ = compose["services"]["redis"]
    command = _cmd(redis_).split()
    password = command[command.index("--requirepass") + 1]
    assert password and redis_["environment"]["REDISCLI_AUTH"] == password  # the healthcheck's ping
    for name, service in _app_services(compose).items():
        assert service["environment"]["NANOFLEET_REDIS_URL"].startswith(f"redis://:{password}@redis:"), name
