"""Shared test configuration: hypothesis profiles (``HYPOTHESIS_PROFILE=ci`` runs more,
``quick`` fewer: the edit-test loop's) and the ``slow`` marker."""

import os

import pytest
from hypothesis import HealthCheck, settings

settings.register_profile("dev", max_examples=100, deadline=None)
settings.register_profile(
    "ci", max_examples=400, deadline=None, suppress_health_check=[HealthCheck.too_slow]
)
#: The edit-test loop's profile (docs/development.md): every property, those that ask for
#: more examples included, runs at most QUICK_EXAMPLES.
QUICK_EXAMPLES = 10
settings.register_profile("quick", max_examples=QUICK_EXAMPLES, deadline=None)
PROFILE = os.environ.get("HYPOTHESIS_PROFILE", "dev")
settings.load_profile(PROFILE)

#: The files whose tests start processes or real services (nats-server, SPADE's XMPP server,
#: the MCP and A2A SDKs, a wheel build) or drive an exporter's real counterpart: marked
#: ``slow``, so that ``pytest -m "not slow"`` is the edit-test loop's subset
#: (docs/development.md). The whole suite is what CI runs.
SLOW_FILES = frozenset({
    "test_a2a.py", "test_agent.py", "test_bench_runtime.py", "test_bench_smoke.py",
    "test_export.py", "test_mcp.py", "test_nats.py", "test_negotiate.py", "test_packaging.py",
    "test_readme.py", "test_serve_attacks.py", "test_serve_log.py", "test_session_runtime.py",
    "test_spade.py", "test_fuzz.py", "test_cli.py", "test_state_lock.py",
    # servers in processes, guarded workers, MCP/A2A stacks:
    "test_handler_failures.py", "test_compat_worker.py", "test_compile_bounds.py",
    "test_mcp_stdio_bounds.py", "test_mcp_intents.py", "test_logging.py",
    "test_a2a_server.py", "test_analysis_budgets.py",
})


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Mark the tests of :data:`SLOW_FILES` ``slow``; under the ``quick`` profile, cap
    each property's own ``@settings(max_examples=…)`` at :data:`QUICK_EXAMPLES`."""
    for item in items:
        if item.path.name in SLOW_FILES:
            item.add_marker(pytest.mark.slow)
        if PROFILE == "quick":
            _cap_examples(getattr(item, "obj", None))


def _cap_examples(test: object) -> None:
    # Hypothesis has no public cap over a test's explicit settings: the settings its
    # @given wrapper reads at each call are replaced by a copy with fewer examples (a
    # no-op, not an error, should the attribute ever go).
    own = getattr(test, "_hypothesis_internal_use_settings", None)
    if isinstance(own, settings) and own.max_examples > QUICK_EXAMPLES:
        test._hypothesis_internal_use_settings = settings(  # type: ignore[attr-defined]
            own, max_examples=QUICK_EXAMPLES)
