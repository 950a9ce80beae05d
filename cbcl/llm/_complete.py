"""The repair loop: ask a model for a message, check it, hint, ask again (spec/llm.md §14).

Theory of operation
-------------------
:func:`complete` (and its async twin :func:`complete_async`) drives any model call,
``generate(prompt)``, through the loop every application writes by hand: the prompt
(:func:`cbcl.llm.render_prompt`'s section for the protocol and intent, then the task),
the answer checked, and, when it is refused, the refused answer and the error's repair
hint (:meth:`cbcl.CBCLError.hint`) added to the prompt for the next try. The loop is one
sans-io object (:class:`_Loop`: prompts out, chunks of answers in, verdicts out); the two
drivers only call the model and keep the clock.

An answer is read as it arrives when ``generate`` returns an iterable of ``str`` chunks
(an async iterable, for the twin), or whole when it returns a ``str``. Either way it
goes through one :class:`_Answer`: from the first ``(`` that opens ``(CBCL/`` on, the
text is fed to a :class:`~cbcl.llm.Checker` (with the intent and protocol required), so
a streamed answer is cut off at the first refused token, and at the ``)`` that ends the
message (what follows is prose the loop would drop). A message the checker read whole is
the answer; otherwise :func:`cbcl.llm.extract` judges the text, to say what is wrong
with it (no message, JSON, a message cut short).

Everything is bounded: ``max_tries`` answers; ``max_output_bytes`` of each answer (a
streamed answer is cut there, a whole one refused); a ``deadline`` (seconds from the
call, read on ``clock``) before which each try must start and, for a stream, each chunk
arrive (the async twin also cancels a call still running at the deadline; a synchronous
call cannot be interrupted, so its whole answer is judged when it comes back). The
refused answer quoted in the next prompt is clipped to :data:`QUOTED_CHARS`.
"""

from __future__ import annotations

import asyncio
import inspect
import math
import re
import time
from collections.abc import AsyncIterable, Awaitable, Callable, Iterable
from dataclasses import dataclass
from typing import Any

from ..core._errors import CBCLError, LimitError
from ..core._limits import DEFAULT_LIMITS, Limits
from ..core._reader import context_of, position_of
from ..protocol._message import Intent, Message
from ..protocol._protocol import Protocol
from ..protocol._registry import Registry
from ._checker import Checker, Refused, _index_of
from ._extract import INPUT_FACTOR, extract
from ._prompt import render_prompt

__all__ = ["Attempt", "Completion", "CompletionError", "complete", "complete_async"]

#: The default ``max_tries``.
MAX_TRIES = 3
#: The most characters of a refused answer quoted back to the model.
QUOTED_CHARS = 4000
#: What a model call may return: the answer, or its chunks as they come.
Answer = str | Iterable[str]

_CANDIDATE = re.compile(r"\([ \t\r\n]*+(?i:cbcl)/")


@dataclass(frozen=True, slots=True)
class Attempt:
    """One answer: its ``text`` (as far as it was read), the ``error`` it was refused with
    (``None``: accepted) and that error's ``hint``, the UTF-8 sizes of the prompt and of
    the answer read, and whether the answer was cut off (``stopped``: at the first
    refused token, at the message's end, or at a bound)."""

    text: str
    error: CBCLError | None
    hint: str | None
    prompt_bytes: int
    output_bytes: int
    stopped: bool


@dataclass(frozen=True, slots=True)
class Completion:
    """What :func:`complete` returns: the accepted ``message``, its ``text`` as the model
    wrote it, and every ``attempts`` (the last one accepted)."""

    message: Message
    text: str
    attempts: tuple[Attempt, ...]


class CompletionError(CBCLError):
    """No accepted message within the bounds: ``attempts`` holds every answer with its
    error and hint; ``reason`` is ``"max_tries"`` or ``"deadline"``."""

    kind = "completion"
    exit_code = 1

    def __init__(self, message: str, *, attempts: tuple[Attempt, ...], reason: str) -> None:
        super().__init__(message)
        self.attempts = attempts
        self.reason = reason


class _Answer:
    """One answer read as it arrives (see the module doc)."""

    def __init__(self, loop: _Loop) -> None:
        self._loop = loop
        self._parts: list[str] = []
        self._size = 0  # characters
        self._bytes = 0
        self._tail = ""  # the last characters, where a candidate may start
        self._checker: Checker | None = None
        self._begin = 0  # where the message the checker reads starts in the answer
        self.refused: Refused | None = None
        self.complete = False
        self.error: CBCLError | None = None
        self.stopped = False

    def add(self, chunk: str) -> bool:
        """Read ``chunk``; ``False`` when nothing more should be read."""
        if type(chunk) is not str:
            raise TypeError(f"a model's answer is str or str chunks, not {type(chunk).__name__}")
        size = len(chunk.encode("utf-8", "surrogatepass"))
        maximum = self._loop.max_output_bytes
        if self._bytes + size > maximum:
            chunk = chunk.encode("utf-8", "surrogatepass")[:maximum - self._bytes].decode(
                "utf-8", "ignore")
            self._append(chunk)
            self.error = LimitError(f"the answer is longer than {maximum} bytes "
                                    "(max_output_bytes)", limit="max_output_bytes",
                                    maximum=maximum)
            self.stopped = True
            return False
        self._append(chunk)
        return not self.stopped

    def _append(self, chunk: str) -> None:
        before = self._size
        self._parts.append(chunk)
        self._size += len(chunk)
        self._bytes += len(chunk.encode("utf-8", "surrogatepass"))
        if self.stopped or not chunk:
            return
        piece = chunk
        if self._checker is None:
            window = self._tail + chunk
            found = _CANDIDATE.search(window)
            if found is None:
                self._tail = window[-64:]
                return
            self._checker = self._loop.checker()
            self._begin = before - len(self._tail) + found.start()
            piece = window[found.start():]
        verdict = self._checker.feed(piece)
        if isinstance(verdict, Refused):
            self.refused = verdict
            self.stopped = True
        elif verdict.complete:
            self.complete = True
            self.stopped = True

    @property
    def text(self) -> str:
        return "".join(self._parts)

    @property
    def output_bytes(self) -> int:
        return self._bytes

    def _moved(self, error: CBCLError) -> CBCLError:
        """``error``, found in the message's text, with its position moved into the
        answer (where the model, shown its answer, finds it)."""
        position = error.position
        if self._checker is not None and position is not None and position.line:
            index = self._begin + _index_of(self._checker.text, position)
            text = self.text
            error.position = position_of(text, index)
            error.context = context_of(text, index)
        return error

    def verdict(self) -> tuple[Message | None, str, CBCLError | None]:
        """The message and its text, or the error the answer is refused with."""
        if self.error is not None:
            return None, "", self.error
        if self.refused is not None:
            return None, "", self._moved(self.refused.error)
        if self._checker is not None and self.complete:
            final = self._checker.finish()
            if isinstance(final, Refused):
                return None, "", self._moved(final.error)
            assert final.message is not None
            return final.message, self._checker.text[:final.end], None
        try:  # no whole message: extract says what is wrong (or finds one after all)
            found = extract(self.text, registry=self._loop.registry, limits=self._loop.limits,
                            max_input_bytes=max(1, self._loop.max_output_bytes))
        except CBCLError as error:
            return None, "", error
        return self._loop.judge(found[0].message, found[0].text)


class _Loop:
    """The loop without its input and output: the prompts, the answers' verdicts, the
    attempts (sans-io; the drivers call the model and keep the clock)."""

    def __init__(self, registry: Registry, intent: Intent | str,
                 protocol: Protocol | str | None, task: str, max_tries: int,
                 max_output_bytes: int | None, limits: Limits | None,
                 prompt: str | None) -> None:
        if not isinstance(registry, Registry):
            raise TypeError("registry must be a cbcl.Registry")
        if type(max_tries) is not int or max_tries < 1:
            raise ValueError("max_tries must be a positive int")
        self.limits = DEFAULT_LIMITS if limits is None else limits
        if not isinstance(self.limits, Limits):
            raise TypeError("limits must be a cbcl.Limits")
        if max_output_bytes is None:
            max_output_bytes = INPUT_FACTOR * self.limits.max_message_bytes
        if type(max_output_bytes) is not int or max_output_bytes < 1:
            raise ValueError("max_output_bytes must be a positive int")
        if not isinstance(task, str):
            raise TypeError("task must be a str")
        self.registry = registry
        self.intent = Intent(intent)
        self.protocol = _protocol(registry, protocol)
        self.max_tries = max_tries
        self.max_output_bytes = max_output_bytes
        self.attempts: list[Attempt] = []
        section = render_prompt(self.protocol, registry=registry, intent=self.intent) \
            if prompt is None else prompt
        wanted = (f"Reply with one CBCL/1.0 message of intent {self.intent.value} in "
                  f"protocol {self.protocol.id}.\n")
        self.base = f"{section}\n## Your task\n\n" + (f"{task}\n\n" if task else "") + wanted
        self.prompt = self.base

    def checker(self) -> Checker:
        return Checker(self.registry, intent=self.intent, protocol=self.protocol,
                       trailing=True, limits=self.limits)

    def judge(self, message: Message, text: str) -> tuple[Message | None, str,
                                                           CBCLError | None]:
        """A message extract found: of the wanted intent and protocol? (The checker
        requires both of what it reads; extract does not.)"""
        checker = self.checker()
        verdict = checker.feed(text)
        final = verdict if isinstance(verdict, Refused) else checker.finish()
        if isinstance(final, Refused):
            return None, "", final.error
        return message, text, None

    def answer(self) -> _Answer:
        return _Answer(self)

    def settle(self, answer: _Answer) -> Completion | None:
        """Record ``answer``'s attempt: the :class:`Completion` if it is accepted, else
        ``None`` (and the next prompt, which quotes it with its hint)."""
        message, text, error = answer.verdict()
        hint = None if error is None else error.hint()
        self.attempts.append(Attempt(answer.text, error, hint, _size(self.prompt),
                                     answer.output_bytes, answer.stopped))
        if message is not None:
            return Completion(message, text, tuple(self.attempts))
        quoted = answer.text
        if len(quoted) > QUOTED_CHARS:
            quoted = quoted[:QUOTED_CHARS] + "\n[… cut]"
        fence = "````" if "```" in quoted else "```"
        self.prompt = (f"{self.base}\n## Your previous answer was refused\n\n{fence}\n"
                       f"{quoted}\n{fence}\n\n{hint}\n\nWrite the whole message again, "
                       "corrected, and nothing else.\n")
        return None

    def more(self) -> bool:
        return len(self.attempts) < self.max_tries

    def failed(self, reason: str) -> CompletionError:
        count = len(self.attempts)
        why = f"after {count} answer(s)" if reason == "max_tries" else \
            f"the deadline passed after {count} answer(s)"
        last = self.attempts[-1].error if self.attempts else None
        return CompletionError(f"no accepted {self.intent.value} message: {why}"
                               + (f"; the last was refused: {last.message}" if last else ""),
                               attempts=tuple(self.attempts), reason=reason)


def _protocol(registry: Registry, protocol: Protocol | str | None) -> Protocol:
    if isinstance(protocol, Protocol):
        return protocol
    if protocol is None:
        held = registry.protocols()
        if len(held) != 1:
            raise ValueError("protocol= is needed: the registry holds "
                             f"{len(held)} protocols")
        return held[0]
    found = registry.get(protocol)
    if found is None:
        raise ValueError(f"the registry holds no protocol {protocol}")
    return found


def _size(text: str) -> int:
    return len(text.encode("utf-8", "surrogatepass"))


def _deadline(deadline: float | None, clock: Callable[[], float]) -> float:
    if deadline is None:
        return math.inf
    if isinstance(deadline, bool) or not isinstance(deadline, (int, float)) or \
            not deadline > 0:
        raise ValueError("deadline must be a positive number of seconds")
    return clock() + float(deadline)


def complete(generate: Callable[[str], Answer], registry: Registry, *,
             intent: Intent | str, protocol: Protocol | str | None = None, task: str = "",
             max_tries: int = MAX_TRIES, max_output_bytes: int | None = None,
             deadline: float | None = None, limits: Limits | None = None,
             prompt: str | None = None,
             clock: Callable[[], float] = time.monotonic) -> Completion:
    """Ask ``generate`` (a model call: prompt in, the answer or its chunks out) for an
    ``intent`` message of ``protocol`` (optional when ``registry`` holds one protocol)
    that does ``task``, until one is accepted (see the module doc). ``prompt``: the
    protocol's section, if not :func:`render_prompt`'s; ``limits`` as :func:`cbcl.parse`
    takes them; ``max_output_bytes`` per answer (default 4 × ``limits.max_message_bytes``);
    ``deadline`` in seconds on ``clock``.

    Returns the :class:`Completion`. Raises :class:`CompletionError` (every attempt, each
    with its error and hint) when ``max_tries`` answers are refused or the deadline
    passes; ``TypeError`` for a coroutine function (use :func:`complete_async`) or an
    answer that is not ``str``; ``ValueError`` for bad bounds or a protocol the registry
    does not hold. What ``generate`` raises is not caught."""
    if inspect.iscoroutinefunction(generate):
        raise TypeError("generate is a coroutine function: use complete_async")
    loop = _Loop(registry, intent, protocol, task, max_tries, max_output_bytes, limits, prompt)
    ends = _deadline(deadline, clock)
    while loop.more():
        if clock() >= ends:
            raise loop.failed("deadline")
        answer = loop.answer()
        output = generate(loop.prompt)
        if inspect.isawaitable(output):
            if inspect.iscoroutine(output):
                output.close()
            raise TypeError("generate returned an awaitable: use complete_async")
        if isinstance(output, str):
            answer.add(output)
        else:
            chunks = iter(output)
            try:
                for chunk in chunks:
                    if not answer.add(chunk) or clock() >= ends:
                        answer.stopped = True
                        break
            finally:
                close = getattr(chunks, "close", None)
                if close is not None:
                    close()
        done = loop.settle(answer)
        if done is not None:
            return done
    raise loop.failed("max_tries")


async def complete_async(generate: Callable[[str], Awaitable[Answer] | AsyncIterable[str]],
                         registry: Registry, *, intent: Intent | str,
                         protocol: Protocol | str | None = None, task: str = "",
                         max_tries: int = MAX_TRIES, max_output_bytes: int | None = None,
                         deadline: float | None = None, limits: Limits | None = None,
                         prompt: str | None = None,
                         clock: Callable[[], float] = time.monotonic) -> Completion:
    """:func:`complete` for an async model call: ``generate(prompt)`` is awaited (its
    answer a ``str`` or chunks), or is an async iterable of ``str`` chunks. Each call, and
    each chunk, is awaited at most until the deadline (then cancelled). Raises as
    :func:`complete`."""
    loop = _Loop(registry, intent, protocol, task, max_tries, max_output_bytes, limits, prompt)
    ends = _deadline(deadline, clock)

    def left() -> float | None:
        return None if ends == math.inf else max(0.0, ends - clock())

    while loop.more():
        if clock() >= ends:
            raise loop.failed("deadline")
        answer = loop.answer()
        output: Any = generate(loop.prompt)
        try:
            if inspect.isawaitable(output):
                output = await asyncio.wait_for(output, left())
            if isinstance(output, str):
                answer.add(output)
            elif isinstance(output, AsyncIterable):
                chunks = aiter(output)
                try:
                    while True:
                        try:
                            chunk = await asyncio.wait_for(anext(chunks), left())
                        except StopAsyncIteration:
                            break
                        if not answer.add(chunk):
                            break
                finally:
                    close = getattr(chunks, "aclose", None)
                    if close is not None:
                        await close()
            else:
                for chunk in output:
                    if not answer.add(chunk):
                        break
        except TimeoutError:
            answer.stopped = True
            loop.attempts.append(Attempt(answer.text, None, None, _size(loop.prompt),
                                         answer.output_bytes, True))
            raise loop.failed("deadline") from None
        done = loop.settle(answer)
        if done is not None:
            return done
    raise loop.failed("max_tries")
