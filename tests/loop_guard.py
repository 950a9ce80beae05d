"""Running a test's asyncio code so that nothing asyncio would only log passes unseen.

:func:`run_guarded` runs a coroutine on a fresh loop whose exception handler collects
every context asyncio reports ("Task exception was never retrieved", "Future exception
was never retrieved", "Task was destroyed but it is pending", an exception in a callback
…), collects the garbage after the loop closed (those reports come from ``__del__``), and
fails the test if any came. :func:`asyncio_records` gives what reached the ``asyncio``
logger (the default handler's way out), for a ``caplog`` check, and :func:`no_stray_asyncio`
makes that check after every test of a module (an autouse fixture there yields from it).
Warnings are errors in this suite (pyproject's ``filterwarnings``), so "coroutine was never
awaited" fails too.
"""

from __future__ import annotations

import asyncio
import gc
import logging
from collections.abc import Awaitable, Callable, Iterator
from typing import Any, TypeVar

import pytest

T = TypeVar("T")


def run_guarded(body: Callable[[], Awaitable[T]]) -> T:
    """``asyncio.run(body())`` with every report of the loop's exception handler, during
    the run and from the garbage left after it, failing the test."""
    stray: list[dict[str, Any]] = []

    async def main() -> T:
        asyncio.get_running_loop().set_exception_handler(
            lambda _, context: stray.append(context))
        return await body()

    result = asyncio.run(main())
    gc.collect()  # "Task was destroyed …" and "… never retrieved" come from __del__
    assert not stray, [context.get("message") for context in stray]
    return result


def asyncio_records(caplog: pytest.LogCaptureFixture) -> list[logging.LogRecord]:
    """What reached the ``asyncio`` logger at WARNING or above (what asyncio's default
    exception handler logs)."""
    return [record for record in caplog.records
            if record.name == "asyncio" and record.levelno >= logging.WARNING]


def no_stray_asyncio(caplog: pytest.LogCaptureFixture) -> Iterator[None]:
    """For an autouse fixture: after the test, collect the garbage and fail if anything
    reached the ``asyncio`` logger at WARNING or above during it."""
    yield
    gc.collect()
    assert not asyncio_records(caplog), [r.getMessage() for r in asyncio_records(caplog)]
