"""Property tests, collected in one place: this folder holds the cross-cutting ones, and the hook
below finds every hypothesis test in the suite (wherever its module lives), marks it `property`
and scales its example count by NANOFLEET_HYPOTHESIS_PROFILE:

    dev       x0.25  (quick local runs)
    ci        x1     (default: each test's own count)
    thorough  x10    (nightly / before a release)

    NANOFLEET_HYPOTHESIS_PROFILE=thorough .venv/bin/python -m pytest -m property

Property suites elsewhere (kept next to the code they guard): tool permission decisions
(tests/shared/test_registry.py, tests/shared/tools/test_permissions.py), workspace path guard
(tests/shared/tools/test_workspace.py), SSRF guard (tests/shared/tools/test_ssrf.py), shell deny
list (tests/shared/tools/test_exec.py), webhook signatures (tests/shared/channels/test_signatures.py),
chunking and formatting (tests/shared/channels/test_text.py), cron next-fire times
(tests/shared/scheduling/test_schedules.py), texts and albums taken in once each, in order
(tests/gateway/test_images.py). Here: the inbound ledger under any delivery order
(test_ledger.py) and the chaos run's oracle (test_chaos_model.py)."""

from __future__ import annotations

import os

import pytest
from hypothesis import settings

from tests.support.platforms import channel_stack, channels  # noqa: F401  (fixtures for test_ledger.py)

SCALES = {"dev": 0.25, "ci": 1.0, "thorough": 10.0}
PROFILE = os.environ.get("NANOFLEET_HYPOTHESIS_PROFILE", "ci")
if PROFILE not in SCALES:
    raise pytest.UsageError(f"NANOFLEET_HYPOTHESIS_PROFILE={PROFILE!r}: use one of {', '.join(SCALES)}")


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line("markers", "property: a hypothesis property test (NANOFLEET_HYPOTHESIS_PROFILE scales it)")


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    scale = SCALES[PROFILE]
    for item in items:
        test = getattr(item, "obj", None)
        if not getattr(test, "is_hypothesis_test", False):
            continue
        item.add_marker(pytest.mark.property)
        current = getattr(test, "_hypothesis_internal_use_settings", None)
        if current is not None and scale != 1.0 and not getattr(test, "_nanofleet_scaled", False):
            # The attribute @given reads at run time (hypothesis' own @seed and @reproduce_failure use it).
            test._hypothesis_internal_use_settings = settings(  # type: ignore[union-attr]
                current, max_examples=max(1, round(current.max_examples * scale)))
            test._nanofleet_scaled = True  # type: ignore[union-attr]
