"""A tool plugin whose import fails in an unexpected way (not an ImportError: a RuntimeError, a
SyntaxError) is named in one line by every process that loads the tool settings. Beat and
`nanofleet status`, which run no tool, go on without it; a worker, which would fail every tool
call, refuses to start."""

from __future__ import annotations

import json
import logging
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pytest
import redis

from shared.constants import BEAT_LOCK
from shared.queueing import make_celery
from shared.settings import Settings, SettingsError
from shared.tools import build_registry, plugin_classes
from tests.support.processes import ROOT, last_line_printed, start_worker, wait_until
from tests.support.stack import Stack
from tests.support.tools import PLUGINS

MODULE = "nanofleet_broken_plugin"
SPEC = f"{MODULE}:WeatherTool"
FAULT = "the plugin's import failed on purpose"


@pytest.fixture
def plugin_dir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A folder on the path with a plugin module that raises at import, as a plugin's own bug would."""
    folder = tmp_path / "plugins"
    folder.mkdir()
    (folder / f"{MODULE}.py").write_text(f"raise RuntimeError({FAULT!r})\n")
    (folder / "nanofleet_not_a_tool.py").write_text("WeatherTool = 42\n")
    monkeypatch.syspath_prepend(str(folder))
    return folder


def _broken(make_stack: Callable[..., Stack], plugin_dir: Path) -> Stack:
    s = make_stack(TOOLS__PLUGINS=json.dumps([*PLUGINS, SPEC]))
    s.env["PYTHONPATH"] = str(plugin_dir)
    return s


def test_any_error_of_a_plugins_import_is_a_settings_error_naming_it(plugin_dir: Path) -> None:
    for spec, what in ((SPEC, f"RuntimeError: {FAULT}"), ("nanofleet_not_a_tool:WeatherTool", "not a Tool class")):
        settings = Settings.model_validate({"tools": {"plugins": [spec]}})
        with pytest.raises(SettingsError, match=f"NANOFLEET_TOOLS__PLUGINS: .*'{spec}'.*{what}"):
            plugin_classes(settings)
        with pytest.raises(SettingsError, match=f"'{spec}'"):
            build_registry(settings)


def test_the_celery_config_is_built_without_the_plugin_and_says_so(plugin_dir: Path,
                                                                   caplog: pytest.LogCaptureFixture) -> None:
    """make_celery runs in every process (beat, status, the gateway's producer): the plugin's time
    limit is left out, with an error naming it."""
    settings = Settings.model_validate({"tools": {"plugins": [SPEC, *PLUGINS]}})
    with caplog.at_level(logging.ERROR):
        app = make_celery(settings)
    without = make_celery(Settings.model_validate({"tools": {"plugins": PLUGINS}}))
    assert app.conf.task_annotations == without.conf.task_annotations
    [record] = [r for r in caplog.records if r.levelno >= logging.ERROR]
    assert f"'{SPEC}'" in record.getMessage() and FAULT in record.getMessage()


def test_beat_and_status_run_and_name_the_plugin_while_a_worker_refuses_to_start(
        make_stack: Callable[..., Stack], plugin_dir: Path) -> None:
    s = _broken(make_stack, plugin_dir)
    beat = s.beat()
    client = redis.Redis.from_url(s.settings.redis_url)
    wait_until(lambda: not beat.alive() or client.exists(BEAT_LOCK), timeout=60, message="beat to take its lock")
    assert beat.alive(), beat.log()[-3000:]
    assert SPEC in beat.log() and FAULT in beat.log() and "Traceback" not in beat.log()

    status = subprocess.run([sys.executable, "-m", "gateway.cli", "status"], cwd=ROOT, env=s.env,
                            capture_output=True, text=True, timeout=120)
    assert status.returncode == 1 and "Traceback" not in status.stderr, status.stderr
    assert "redis      ok" in status.stdout and "beat       ok" in status.stdout, status.stdout
    assert f"plugins    BROKEN: NANOFLEET_TOOLS__PLUGINS: cannot load '{SPEC}'" in status.stdout, status.stdout

    worker = start_worker(s.env, s.settings, s.log_dir, queues="scheduler", concurrency=1, wait=False)
    s.procs.append(worker)
    wait_until(lambda: not worker.alive(), timeout=60, message="the worker to refuse to start")
    assert worker.popen.returncode != 0
    assert f"cannot load '{SPEC}': RuntimeError: {FAULT}" in worker.log() and "Traceback" not in worker.log()
    assert beat.alive()


@pytest.mark.parametrize("command", [["worker", "--queues", "scheduler"], ["gateway", "--port", "0"],
                                     ["agent", "-m", "hi"]])
def test_the_commands_that_need_the_plugins_refuse_in_a_line(command: list[str], make_stack: Callable[..., Stack],
                                                             plugin_dir: Path) -> None:
    s = _broken(make_stack, plugin_dir)
    done = subprocess.run([sys.executable, "-m", "gateway.cli", *command], cwd=ROOT, env=s.env,
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 2, (done.stdout, done.stderr)
    assert done.stderr.strip() == f"nanofleet: NANOFLEET_TOOLS__PLUGINS: cannot load '{SPEC}': RuntimeError: {FAULT}"


def test_without_plugins_beat_and_status_do_not_import_the_tools() -> None:
    """`nanofleet status` took 5 s, half of it importing the tools (and litellm with them) to find
    that no plugin was named (helper's walkthrough); beat's Celery config did the same."""
    code = ("import sys; from shared.settings import Settings; from shared.queueing import make_celery; "
            "from gateway.status import _plugins_line; settings = Settings(); make_celery(settings); "
            "assert _plugins_line(settings, print); "
            "print(sorted(m for m in sys.modules if m.split('.')[0] == 'litellm' or m.startswith('shared.tools'))[:3])")
    assert last_line_printed(code) == "[]"
