"""Flower started outside compose (the README's command) refuses a login from an example, as
compose's entrypoint does: it started with `admin:change-me-now`."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from tests.support.processes import ROOT


def _load(logins: str) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("NANOFLEET_", "FLOWER_"))}
    return subprocess.run([sys.executable, "-c", "import workers.flower"], env={**env, "FLOWER_BASIC_AUTH": logins},
                          cwd=ROOT, capture_output=True, text=True, timeout=120, check=False)


@pytest.mark.parametrize(("logins", "said"), [
    ("admin:change-me-now", "has a password from an example anyone can read ('change-me-now')"),
    ("ops:mine-1234,admin:ChangeMe", "has a password from an example anyone can read ('ChangeMe')"),
    ("admin:", "has an empty user or password"),
    ("admin", "must be user:password (several: a comma between them)"),
])
def test_a_login_from_an_example_stops_flower(logins: str, said: str) -> None:
    loaded = _load(logins)
    assert loaded.returncode != 0 and f"FLOWER_BASIC_AUTH {said}; refusing to start Flower" in loaded.stderr


def test_a_login_of_ones_own_is_taken() -> None:
    loaded = _load("ops:a-password-of-my-own")
    assert loaded.returncode == 0, loaded.stderr
