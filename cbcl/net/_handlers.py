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
* A plain function marked :func:`on_loop` (one that never blocks) is called on the loop,
  contained like the others but not cut off: it saves the thread hop.
"""

from __future__ import annotations

import asyncio
import contextlib
import contextvars
import inspect
import queue
import threading
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

from ..protocol._message import Message
from ._transport import _check_count, _check_seconds

#: How long a cancelled coroutine handler is given to end before it is left to itself.
CANCEL_WAIT = 1.0
#: Seconds an idle handler thread waits for work before it ends.
KEEP_ALIVE = 5.0


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
    """At most ``max_threads`` daemon threads running plain handlers (see the module doc),
    started as needed; one idle for ``keep_alive`` seconds ends. :attr:`busy` counts the
    threads taken, handlers that overran and still run included. :meth:`close` lets them
    end; a call after it is ``"stopped"``. Raises ``ValueError`` for a count or a
    keep-alive out of range."""

    def __init__(self, max_threads: int = 8, *, name: str = "cbcl-handler",
                 keep_alive: float = KEEP_ALIVE) -> None:
        _check_count("max_threads", max_threads, upper=4096)
        _check_seconds("keep_alive", keep_alive)
        self.max_threads = max_threads
        self.keep_alive = keep_alive
        self._name = name
        self._lock = threading.Lock()
        self._work: queue.SimpleQueue[_Job | None] = queue.SimpleQueue()
        self._threads: list[threading.Thread] = []
        self._busy = 0
        self._waiters: list[tuple[asyncio.AbstractEventLoop, asyncio.Future[None]]] = []
        self.closed = False

    @property
    def busy(self) -> int:
        """Threads taken: running a handler, or about to."""
        return self._busy

    @property
    def live(self) -> int:
        """Threads alive now, idle ones included (never more than ``max_threads``)."""
        return len(self._threads)

    def close(self) -> None:
        """Take no more calls; each thread ends once it is idle (one running a handler
        that overran ends when the handler returns). A second call does nothing."""
        with self._lock:
            if self.closed:
                return
            self.closed = True
            started = len(self._threads)
        for _ in range(started):
            self._work.put(None)

    def _take(self) -> bool:
        with self._lock:
            if self._busy >= self.max_threads or self.closed:
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
            if self.closed:
                return False
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

    def _start(self, call: Callable[[], Any]) -> asyncio.Future[tuple[bool, Any]]:
        """Run ``call`` on the thread just taken; the future (of the running loop) gets
        ``(True, result)`` or ``(False, exception)``. Cancelling it drops the result (and
        the call, if its thread has not begun it)."""
        loop = asyncio.get_running_loop()
        done: asyncio.Future[tuple[bool, Any]] = loop.create_future()
        self._work.put((loop, done, call, contextvars.copy_context()))
        return done

    def _worker(self) -> None:
        me = threading.current_thread()
        while True:
            try:
                job = self._work.get(timeout=self.keep_alive)
            except queue.Empty:
                with self._lock:  # idle: end, if the threads left cover every call taken
                    if len(self._threads) - 1 >= self._busy:
                        self._threads.remove(me)
                        return
                continue
            if job is None:  # closed
                with self._lock:
                    self._threads.remove(me)
                return
            loop, done, call, context = job
            if done.cancelled():  # the caller left before this thread began (a benign race)
                self._release()
                continue
            try:
                result: tuple[bool, Any] = (True, context.run(call))
            except BaseException as exc:  # user code: whatever it raises is its outcome
                result = (False, exc)
            self._release()
            with contextlib.suppress(RuntimeError):  # its loop is closed: nobody waits
                loop.call_soon_threadsafe(_settle, done, result)
            del job, loop, done, call, context, result  # hold nothing of the last call


#: One call for a worker: the caller's loop and future, the call, its context.
_Job = tuple[asyncio.AbstractEventLoop, "asyncio.Future[tuple[bool, Any]]", Callable[[], Any],
             contextvars.Context]


def _settle(done: asyncio.Future[tuple[bool, Any]], result: tuple[bool, Any]) -> None:
    if not done.done():
        done.set_result(result)


def _wake(waiter: asyncio.Future[None]) -> None:
    if not waiter.done():
        waiter.set_result(None)


async def _first(work: asyncio.Future[Any], stop: asyncio.Future[Any] | None,
                 deadline: float) -> bool:
    """Wait for ``work`` until ``deadline`` (loop time) or ``stop``; returns whether
    ``work`` is done. (What ``asyncio.wait`` does, with one future and one timer.)"""
    if work.done():
        return True
    loop = asyncio.get_running_loop()
    if deadline <= loop.time() or (stop is not None and stop.done()):
        return False
    waiter: asyncio.Future[None] = loop.create_future()

    def wake(_: object = None) -> None:
        if not waiter.done():
            waiter.set_result(None)

    timer = loop.call_at(deadline, wake)
    work.add_done_callback(wake)
    if stop is not None:
        stop.add_done_callback(wake)
    try:
        await waiter
    finally:
        timer.cancel()
        work.remove_done_callback(wake)
        if stop is not None:
            stop.remove_done_callback(wake)
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


class OnLoop:
    """A plain handler marked to run on the event loop (:func:`on_loop`)."""

    __slots__ = ("__wrapped__", "handler")

    def __init__(self, handler: Callable[..., Any]) -> None:
        self.handler = handler
        self.__wrapped__ = handler

    def __call__(self, *args: Any) -> Any:
        return self.handler(*args)

    def __repr__(self) -> str:
        return f"on_loop({self.handler!r})"


def on_loop(handler: Callable[..., Any]) -> OnLoop:
    """Mark a plain (not ``async``) handler to run on the event loop instead of a thread:
    for one that never blocks — a few microseconds of work on the message, no I/O, no
    lock — to save the thread hop (some 30-50 µs of CPU a call). Whatever it raises is
    still contained, but it cannot be cut off at its deadline, and while it runs it holds
    up every link of the agent. ``cbcl serve``'s default responder runs so. Raises
    ``TypeError`` for something that is not callable."""
    if not callable(handler):
        raise TypeError("a handler must be callable")
    return handler if isinstance(handler, OnLoop) else OnLoop(handler)


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
    if type(handler) is OnLoop and (stop is None or not stop.done()):
        # The common case first, with nothing made that it does not need: a reply or None.
        try:
            value = handler.handler(*args)
        except BaseException as exc:  # user code: whatever it raises is its outcome
            return Outcome("raised", exc, loop.time() - started)
        if value is None or isinstance(value, Message) or not inspect.isawaitable(value):
            return Outcome("answer", value, loop.time() - started)
        return await settle_awaitable(value, loop, started, started + timeout, stop)
    deadline = started + timeout

    def outcome(kind: str, value: Any = None) -> Outcome:
        return Outcome(kind, value, loop.time() - started)

    def ended() -> Outcome:
        return outcome("stopped" if stop is not None and stop.done() else "timeout")

    if stop is not None and stop.done():
        return outcome("stopped")
    awaitable: Any
    if isinstance(handler, OnLoop):  # marked never to block: called here, contained
        try:
            value = handler.handler(*args)
        except BaseException as exc:  # user code: whatever it raises is its outcome
            return outcome("raised", exc)
        if not inspect.isawaitable(value):
            return outcome("answer", value)
        awaitable = value
    elif is_coroutine_handler(handler):
        try:
            awaitable = handler(*args)
        except BaseException as exc:  # user code (a signature that does not fit, say)
            return outcome("raised", exc)
    else:
        if not await threads._wait_for_thread(deadline, stop):
            if (stop is not None and stop.done()) or threads.closed:
                return outcome("stopped")
            return outcome("timeout", "thread")
        done = threads._start(lambda: handler(*args))
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
    return await settle_awaitable(awaitable, loop, started, deadline, stop)


async def settle_awaitable(awaitable: Awaitable[Any], loop: asyncio.AbstractEventLoop,
                            started: float, deadline: float,
                            stop: asyncio.Future[Any] | None) -> Outcome:
    """Await what a handler returned, contained, until ``deadline`` or ``stop``."""
    def outcome(kind: str, value: Any = None) -> Outcome:
        return Outcome(kind, value, loop.time() - started)

    task = loop.create_task(_contained(awaitable))
    try:
        if not await _first(task, stop, deadline):
            return outcome("stopped" if stop is not None and stop.done() else "timeout")
    finally:
        if not task.done():
            task.cancel()
            await _first(task, None, loop.time() + CANCEL_WAIT)
            task.add_done_callback(_retrieve)  # (a task that will not end is left to run)
    if task.cancelled():  # by the handler itself: we had not cancelled it
        return outcome("raised", asyncio.CancelledError())
    succeeded, value = task.result()
    return outcome("answer" if succeeded else "raised", value)


__all__ = ["CANCEL_WAIT", "KEEP_ALIVE", "HandlerLimits", "HandlerThreads", "OnLoop", "Outcome",
           "is_coroutine_handler", "on_loop", "run_handler", "settle_awaitable"]
