"""Running handlers: user code, contained, bounded, and cut off at its deadline.

Theory of operation
-------------------
A handler is user code: it may raise anything (``SystemExit`` and ``KeyboardInterrupt``
included), block, never return, or return something that is not a message.
:func:`run_handler` calls one for one message and returns an :class:`Outcome`; it never
raises, except ``CancelledError`` when its own caller is cancelled (the handler is then
stopped as below).

* A coroutine function is called on the event loop and its coroutine awaited in a task of
  its own, inside a wrapper that catches every exception the coroutine raises (asyncio
  re-raises ``SystemExit`` and ``KeyboardInterrupt`` out of the event loop, which would
  end the server). At the deadline, when ``stop`` is done (shutdown) or when the caller is
  cancelled (the client went away), the task is cancelled.
* Any other callable runs in a :class:`HandlerThreads` worker, so a slow one stalls no
  link: at most ``max_threads`` run at once. A thread cannot be killed: when its caller
  stops waiting (the deadline, ``stop``, the caller cancelled) the thread runs on, its
  result is dropped, and it keeps its place until it returns. So handlers that never
  return cannot make threads grow: once every thread is taken, a new call waits for one
  until its deadline and then times out without having run. The workers are daemon
  threads, so a handler stuck for ever does not keep the process from exiting. A plain
  function that returns an awaitable has it awaited on the loop, within the same deadline.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import contextvars
import inspect
import queue
import threading
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

from ._transport import _check_count, _check_seconds

#: How long a cancelled coroutine handler is given to end before it is left to itself.
CANCEL_WAIT = 1.0


@dataclass(frozen=True, slots=True)
class HandlerLimits:
    """How an :class:`~cbcl.Agent` runs its handlers (spec/negotiation.md §6.3).

    ``handler_concurrency``: handlers running at once on one link (for different
    conversations; one conversation's messages are handled one at a time, in order);
    ``handler_backlog``: messages of one link taken and not yet handled (running or
    waiting) — at this many the link reads no further until one is done;
    ``handler_threads``: threads that run plain (not ``async``) handlers, for the whole
    agent — a thread whose handler overran keeps its place until the handler returns;
    ``shutdown_grace``: seconds :meth:`~cbcl.Agent.close` lets running handlers finish
    before stopping them (they are answered ``shutdown``). Raises ``ValueError`` for a
    value out of range."""

    handler_concurrency: int = 16
    handler_backlog: int = 64
    handler_threads: int = 8
    shutdown_grace: float = 5.0

    def __post_init__(self) -> None:
        _check_count("handler_concurrency", self.handler_concurrency, upper=1 << 16)
        _check_count("handler_backlog", self.handler_backlog, upper=1 << 16)
        _check_count("handler_threads", self.handler_threads, upper=4096)
        _check_seconds("shutdown_grace", self.shutdown_grace)


@dataclass(frozen=True, slots=True)
class Outcome:
    """What one handler call came to. ``kind``: ``"answer"`` (``value`` is what the
    handler returned), ``"raised"`` (``value`` is the exception, of any kind),
    ``"timeout"`` (no answer by the deadline; ``value`` is ``"thread"`` when no thread was
    free before it, so the handler never ran) or ``"stopped"`` (``stop`` came first).
    ``seconds``: from the call to the outcome."""

    kind: str
    value: Any = None
    seconds: float = 0.0


class HandlerThreads:
    """At most ``max_threads`` daemon threads running plain handlers (see the module doc).
    :attr:`busy` counts the threads taken, handlers that overran and still run included."""

    def __init__(self, max_threads: int = 8, *, name: str = "cbcl-handler") -> None:
        _check_count("max_threads", max_threads, upper=4096)
        self.max_threads = max_threads
        self._name = name
        self._lock = threading.Lock()
        self._work: queue.SimpleQueue[
            tuple[concurrent.futures.Future[tuple[bool, Any]], Callable[[], Any],
                  contextvars.Context]] = queue.SimpleQueue()
        self._threads: list[threading.Thread] = []
        self._busy = 0
        self._waiters: list[tuple[asyncio.AbstractEventLoop, asyncio.Future[None]]] = []

    @property
    def busy(self) -> int:
        """Threads taken: running a handler, or about to."""
        return self._busy

    @property
    def started(self) -> int:
        """Threads started so far (never more than ``max_threads``)."""
        return len(self._threads)

    def _take(self) -> bool:
        with self._lock:
            if self._busy >= self.max_threads:
                return False
            self._busy += 1
            if len(self._threads) < self._busy:
                thread = threading.Thread(target=self._worker, daemon=True,
                                          name=f"{self._name}-{len(self._threads) + 1}")
                self._threads.append(thread)
                thread.start()
            return True

    def _release(self) -> None:
        with self._lock:
            self._busy -= 1
            waiters, self._waiters = self._waiters, []
        for loop, waiter in waiters:
            with contextlib.suppress(RuntimeError):  # its loop is closed
                loop.call_soon_threadsafe(_wake, waiter)

    async def _wait_for_thread(self, deadline: float, stop: asyncio.Future[Any] | None
                               ) -> bool:
        """Take a thread, waiting for one until ``deadline`` (loop time) or ``stop``;
        returns whether one was taken."""
        loop = asyncio.get_running_loop()
        while not self._take():
            waiter: asyncio.Future[None] = loop.create_future()
            with self._lock:
                free = self._busy < self.max_threads
                if not free:
                    self._waiters.append((loop, waiter))
            if free:
                continue  # one was given back meanwhile
            try:
                if not await _first(waiter, stop, deadline):
                    return False
            finally:
                with self._lock, contextlib.suppress(ValueError):
                    self._waiters.remove((loop, waiter))
                waiter.cancel()
            if stop is not None and stop.done():
                return False
        return True

    def _start(self, call: Callable[[], Any]) -> concurrent.futures.Future[tuple[bool, Any]]:
        """Run ``call`` on the thread just taken; its future holds ``(True, result)`` or
        ``(False, exception)``."""
        done: concurrent.futures.Future[tuple[bool, Any]] = concurrent.futures.Future()
        self._work.put((done, call, contextvars.copy_context()))
        return done

    def _worker(self) -> None:
        while True:
            done, call, context = self._work.get()
            if not done.set_running_or_notify_cancel():
                self._release()
                continue
            try:
                result: tuple[bool, Any] = (True, context.run(call))
            except BaseException as exc:  # user code: whatever it raises is its outcome
                result = (False, exc)
            self._release()
            done.set_result(result)
            del done, call, context, result  # hold nothing of the last call while idle


def _wake(waiter: asyncio.Future[None]) -> None:
    if not waiter.done():
        waiter.set_result(None)


async def _first(work: asyncio.Future[Any], stop: asyncio.Future[Any] | None,
                 deadline: float) -> bool:
    """Wait for ``work`` until ``deadline`` (loop time) or ``stop``; returns whether
    ``work`` is done."""
    left = deadline - asyncio.get_running_loop().time()
    if left > 0 and not work.done():
        waits: set[asyncio.Future[Any]] = {work} if stop is None else {work, stop}
        await asyncio.wait(waits, timeout=left, return_when=asyncio.FIRST_COMPLETED)
    return work.done()


async def _contained(awaitable: Awaitable[Any]) -> tuple[bool, Any]:
    try:
        return True, await awaitable
    except asyncio.CancelledError:
        raise
    except BaseException as exc:  # user code: SystemExit must not leave the task
        return False, exc


def _retrieve(task: asyncio.Future[Any]) -> None:
    if not task.cancelled():
        task.exception()


def is_coroutine_handler(handler: Callable[..., Any]) -> bool:
    """Whether calling ``handler`` gives a coroutine to await (an ``async def`` function,
    a partial of one, or an object whose ``__call__`` is one)."""
    return inspect.iscoroutinefunction(handler) or inspect.iscoroutinefunction(
        type(handler).__call__)


async def run_handler(handler: Callable[..., Any], *args: Any, threads: HandlerThreads,
                      timeout: float, stop: asyncio.Future[Any] | None = None) -> Outcome:
    """Call ``handler(*args)`` as the module doc says and return its :class:`Outcome`
    within ``timeout`` seconds (plus at most :data:`CANCEL_WAIT` for a coroutine that
    delays its cancellation). Raises only ``CancelledError`` (the handler is then
    cancelled, or its thread's result dropped)."""
    loop = asyncio.get_running_loop()
    started = loop.time()
    deadline = started + timeout

    def outcome(kind: str, value: Any = None) -> Outcome:
        return Outcome(kind, value, loop.time() - started)

    def ended() -> Outcome:
        return outcome("stopped" if stop is not None and stop.done() else "timeout")

    if stop is not None and stop.done():
        return outcome("stopped")
    awaitable: Any
    if is_coroutine_handler(handler):
        try:
            awaitable = handler(*args)
        except BaseException as exc:  # user code (a signature that does not fit, say)
            return outcome("raised", exc)
    else:
        if not await threads._wait_for_thread(deadline, stop):
            if stop is not None and stop.done():
                return outcome("stopped")
            return outcome("timeout", "thread")
        done = asyncio.wrap_future(threads._start(lambda: handler(*args)))
        try:
            if not await _first(done, stop, deadline):
                return ended()
        finally:
            if not done.done():
                done.cancel()  # the thread runs on; what it returns is dropped
        succeeded, value = done.result()
        if not succeeded:
            return outcome("raised", value)
        if not inspect.isawaitable(value):
            return outcome("answer", value)
        awaitable = value
    task = loop.create_task(_contained(awaitable))
    try:
        if not await _first(task, stop, deadline):
            return ended()
    finally:
        if not task.done():
            task.cancel()
            await asyncio.wait({task}, timeout=CANCEL_WAIT)
            task.add_done_callback(_retrieve)  # (a task that will not end is left to run)
    if task.cancelled():  # by the handler itself: we had not cancelled it
        return outcome("raised", asyncio.CancelledError())
    succeeded, value = task.result()
    return outcome("answer" if succeeded else "raised", value)


__all__ = ["CANCEL_WAIT", "HandlerLimits", "HandlerThreads", "Outcome", "is_coroutine_handler",
           "run_handler"]
