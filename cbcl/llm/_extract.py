"""Extraction: the CBCL message(s) in a model's output, found, never repaired.

Theory of operation
-------------------
A model asked for a CBCL message answers with text around it: a Markdown fence (with or
without a language tag), prose before and after, sometimes several messages.
:func:`extract` is a pure function over that text (sans-io) that finds each message and
parses it exactly as written — both passes, with the registry given — and reports the
text it dropped. It never rewrites a message's text: a candidate that is not a whole,
valid message is refused with the error :func:`cbcl.parse` raises for it (its position
moved into the whole input), whose :meth:`~cbcl.CBCLError.hint` says how to fix it.

Finding candidates uses CBCL's own reader rules, not a second lexer:

1. Fences are found line by line (a line of three or more backticks or tildes, as
   CommonMark writes them; a fence that is never closed runs to the end).
2. A candidate starts at each ``(`` followed, after whitespace, by ``CBCL/`` (in any
   case, so that ``(cbcl/1.0`` is refused as an envelope error rather than overlooked).
3. From there the reader's token expression (:data:`cbcl.core._reader.TOKEN`: strings with
   their escapes, comments, atoms) is matched token by token, counting parentheses, up
   to the ``)`` that closes the first. A candidate never runs past its fence's end or,
   outside fences, the next fence (a fence line is never CBCL text: a backtick starts no
   token). A candidate whose lists never close, or that meets a character no token
   starts, is parsed as far as its region goes, and the parse raises the precise error.
4. What follows a message must not look like its continuation: on the rest of its line a
   ``(`` or ``)`` is refused (a stray parenthesis would otherwise cut a message short and
   leave its tail in the prose), and inside a fence only whitespace, comments or another
   message may follow.

Work is bounded: the input may hold at most ``max_input_bytes`` (default
:data:`INPUT_FACTOR` × the limits' ``max_message_bytes``) and at most ``max_messages``
messages; every scan is linear, each candidate is read once, and the first refusal ends
the call. Every failure is a :class:`CBCLError`.
"""

from __future__ import annotations

import re
from bisect import bisect_left, bisect_right
from dataclasses import dataclass

from ..core._errors import CBCLError, LimitError, MalformedError
from ..core._limits import DEFAULT_LIMITS, Limits
from ..core._reader import (
    BAD,
    EOF,
    LPAR,
    RPAR,
    TOKEN,
    context_of,
    decode,
    position_of,
    token_start,
)
from ..protocol._api import parse
from ..protocol._hints import TextHint
from ..protocol._message import Message
from ..protocol._registry import Registry

__all__ = ["INPUT_FACTOR", "DroppedSpan", "Extracted", "extract"]

#: The default input size, in multiples of the limits' ``max_message_bytes``: room for
#: prose, fences and a few messages around the message(s).
INPUT_FACTOR = 4
#: The default ``max_messages``.
MAX_MESSAGES = 64

_CANDIDATE = re.compile(r"\([ \t\r\n]*+(?i:cbcl)/")
_FENCE = re.compile(r"^[ \t]{0,3}(`{3,}+|~{3,}+)([^\n]*+)$", re.MULTILINE)
_JSON = re.compile(r'\{[ \t\r\n]*+"(?:version|message-id|sender|intent)"[ \t\r\n]*+:')


@dataclass(frozen=True, slots=True)
class DroppedSpan:
    """Text that is not part of any message: ``text[start:end]`` of the input (character
    indexes), ``kind`` ``"fence"`` (a fence line) or ``"prose"`` (anything else)."""

    start: int
    end: int
    kind: str
    text: str


@dataclass(frozen=True, slots=True)
class Extracted:
    """One message found by :func:`extract`: the parsed ``message``, its ``text`` exactly as
    written (``input[start:end]``, character indexes of the decoded input), and the
    non-blank text ``dropped`` before it — for the last message, also after it — so that
    the messages' ``dropped`` spans together are all the text dropped, each span once."""

    message: Message
    start: int
    end: int
    text: str
    dropped: tuple[DroppedSpan, ...]


@dataclass(frozen=True, slots=True)
class _Fence:
    open_start: int
    open_end: int  # after the opening line (its LF excluded)
    close_start: int  # the closing line's start, or len(text)
    close_end: int


def _fences(text: str) -> list[_Fence]:
    fences: list[_Fence] = []
    opened: tuple[int, int, str, int] | None = None  # start, end, char, length
    for m in _FENCE.finditer(text):
        marker = m.group(1)
        if opened is None:
            if marker[0] == "`" and "`" in m.group(2):
                continue  # not a fence (CommonMark: no backtick in a backtick fence's info)
            opened = (m.start(), m.end(), marker[0], len(marker))
        elif marker[0] == opened[2] and len(marker) >= opened[3] and not m.group(2).strip():
            fences.append(_Fence(opened[0], opened[1], m.start(), m.end()))
            opened = None
    if opened is not None:
        fences.append(_Fence(opened[0], opened[1], len(text), len(text)))
    return fences


def _refuse(text: str, index: int, message: str, fix: str,
            error: type[MalformedError] = MalformedError) -> MalformedError:
    refused = error(message, position=position_of(text, index),
                    context=context_of(text, index))
    refused.hint_material = TextHint(fix)
    return refused


def _moved(error: CBCLError, text: str, start: int, candidate: str) -> CBCLError:
    """``error``, raised for ``candidate`` (which starts at ``start`` of ``text``), with
    its position and context moved into ``text``."""
    position = error.position
    if position is None or position.line == 0:
        return error
    index = start + _index_of(candidate, error)
    error.position = position_of(text, index)
    error.context = context_of(text, index)
    return error


def extract(data: bytes | bytearray | memoryview | str, *, registry: Registry | None = None,
            limits: Limits | None = None, envelope_only: bool = False,
            max_input_bytes: int | None = None,
            max_messages: int = MAX_MESSAGES) -> list[Extracted]:
    """The CBCL message(s) in ``data`` (a model's output: UTF-8 bytes or ``str``), in order,
    each parsed as :func:`cbcl.parse` parses it (``registry``, ``limits``,
    ``envelope_only`` as there), with the text dropped around them (see
    :class:`Extracted`). Messages may sit in Markdown fences, with or without a language
    tag, or in the prose; nothing in a message's text is changed.

    Raises, for the first candidate that is not a whole, valid message, what
    :func:`cbcl.parse` raises for it, at its position in ``data``; :class:`MalformedError`
    when no message is found (or JSON is, instead of a CBCL message) or when what follows a
    message looks like its continuation; :class:`LimitError` when ``data`` holds more than
    ``max_input_bytes`` (default :data:`INPUT_FACTOR` × ``limits.max_message_bytes``) or
    more than ``max_messages`` messages. Each error's :meth:`~cbcl.CBCLError.hint` says how
    to fix it. ``TypeError`` for input that is neither bytes nor str.
    """
    limits = DEFAULT_LIMITS if limits is None else limits
    if not isinstance(limits, Limits):
        raise TypeError("limits must be a cbcl.Limits")
    if max_input_bytes is None:
        max_input_bytes = INPUT_FACTOR * limits.max_message_bytes
    if type(max_input_bytes) is not int or max_input_bytes < 1:
        raise ValueError("max_input_bytes must be a positive int")
    if type(max_messages) is not int or max_messages < 1:
        raise ValueError("max_messages must be a positive int")
    text = decode(data, Limits(max_message_bytes=max_input_bytes))
    fences = _fences(text)
    opens = [fence.open_start for fence in fences]
    found: list[Extracted] = []
    dropped_from = 0
    pos = 0
    while True:
        m = _CANDIDATE.search(text, pos)
        if m is None:
            break
        start = m.start()
        if len(found) == max_messages:
            raise LimitError(f"more than {max_messages} messages in the input",
                             limit="max_messages", maximum=max_messages,
                             position=position_of(text, start),
                             context=context_of(text, start))
        at = bisect_right(opens, start) - 1  # the last fence opened before the candidate
        fence = fences[at] if at >= 0 and fences[at].open_end <= start < \
            fences[at].close_start else None
        if fence is not None:
            region_end = fence.close_start
        else:
            region_end = opens[at + 1] if at + 1 < len(opens) else len(text)
        end, open_lists, last = _candidate_end(text, start, region_end)
        candidate = text[start:end] if end is not None else text[start:region_end].rstrip()
        try:
            message = parse(candidate, limits=limits, registry=registry,
                            envelope_only=envelope_only)
        except CBCLError as error:
            moved = _moved(error, text, start, candidate)
            if open_lists and (moved.position is None or moved.offset is None or
                               _index_of(text, moved) >= last):
                # Cut short: the refusal is at its last token, or its lists are unclosed.
                where = "its code block" if fence is not None else "the input"
                raise _refuse(
                    text, last, f"the message is incomplete: {open_lists} list(s) are "
                    f"still open where {where} ends",
                    "Write the whole message, not a part of it: finish the last field and "
                    "close every list, ending with the ) that closes (CBCL/1.0.") from None
            raise moved from None
        if end is None:  # pragma: no cover - an unclosed candidate never parses
            raise _refuse(text, start, "the message is incomplete",
                          "Write the whole message, every ( closed by its ).")
        _check_after(text, end, region_end, fence is not None)
        found.append(Extracted(message, start, end, candidate,
                               _dropped(text, dropped_from, start, fences, opens)))
        dropped_from = pos = end
    if not found:
        json = _JSON.search(text)
        if json is not None:
            raise _refuse(text, json.start(), "the input holds JSON, not a CBCL message",
                          "Write the message as a CBCL S-expression, not as JSON: "
                          "(CBCL/1.0 (message-id \"…\") (sender …) …), in parentheses, "
                          "fields as (name value).")
        nothing = MalformedError("no CBCL message found: a message starts with (CBCL/1.0")
        nothing.hint_material = TextHint("Reply with a CBCL message: one S-expression that "
                                         "starts with (CBCL/1.0.")
        raise nothing
    final = found[-1]
    tail = _dropped(text, final.end, len(text), fences, opens)
    if tail:
        found[-1] = Extracted(final.message, final.start, final.end, final.text,
                              final.dropped + tail)
    return found


def _candidate_end(text: str, start: int, region_end: int) -> tuple[int | None, int, int]:
    """The end of the list that opens at ``start``, by the reader's tokens, or ``None``
    when the region ends (or a character no token starts comes) before it closes; the
    lists still open then (0 after a character no token starts: not cut short, but
    malformed), and where the last token read starts."""
    depth = 0
    pos = start
    last = start
    match = TOKEN.match
    while True:
        m = match(text, pos, region_end)
        assert m is not None
        kind = m.lastindex
        if kind == LPAR:
            depth += 1
        elif kind == RPAR:
            depth -= 1
            if depth == 0:
                return m.end(), 0, last
        elif kind == EOF:
            return None, depth, last
        elif kind == BAD:
            at = m.start(BAD)
            if text[at] == '"' and text.find('"', at + 1, region_end) < 0:
                return None, depth, at  # a string cut short: the message was
            return None, 0, last
        last = token_start(m)
        pos = m.end()


def _index_of(text: str, error: CBCLError) -> int:
    """The character index in ``text`` of ``error``'s position (moved there already)."""
    position = error.position
    assert position is not None
    line_start = 0
    for _ in range(position.line - 1):
        line_start = text.index("\n", line_start) + 1
    return line_start + position.column - 1


def _check_after(text: str, end: int, region_end: int, fenced: bool) -> None:
    """Refuse what, after a message, looks like more of it (see the module doc)."""
    if fenced:
        m = TOKEN.match(text, end, region_end)
        assert m is not None
        kind = m.lastindex
        if kind == EOF or (kind == LPAR and _CANDIDATE.match(text, m.start(LPAR))):
            return
        at = m.start(kind or 0) - (1 if kind in (3, 5) else 0)  # a keyword's ':', a '"'
        raise _refuse(text, at, "unexpected data after the message in its code block",
                      "Put the message alone in its code block: nothing but whitespace, "
                      "comments or another message may follow its closing ).",
                      )
    line_end = text.find("\n", end)
    rest = text[end: len(text) if line_end < 0 else line_end]
    stripped = rest.lstrip(" \t\r")
    at = end + len(rest) - len(stripped)
    if stripped[:1] in ("(", ")") and not _CANDIDATE.match(text, at):
        raise _refuse(text, at, "a parenthesis after the end of the message",
                      "Check the parentheses: the message ends at the ) that closes "
                      "(CBCL/1.0; a field after it is not part of the message.")


def _dropped(text: str, start: int, end: int, fences: list[_Fence], opens: list[int],
             ) -> tuple[DroppedSpan, ...]:
    """The non-blank spans of ``text[start:end]``: fence lines, and prose between them."""
    cuts: list[tuple[int, int]] = []
    for fence in fences[max(0, bisect_left(opens, start) - 1):bisect_right(opens, end)]:
        for a, b in ((fence.open_start, fence.open_end), (fence.close_start, fence.close_end)):
            if a < b and start <= a and b <= end:
                cuts.append((a, b))
    spans: list[DroppedSpan] = []
    at = start
    for a, b in sorted(cuts):
        _prose(text, at, a, spans)
        spans.append(DroppedSpan(a, b, "fence", text[a:b]))
        at = b
    _prose(text, at, end, spans)
    return tuple(spans)


def _prose(text: str, start: int, end: int, spans: list[DroppedSpan]) -> None:
    piece = text[start:end]
    stripped = piece.strip()
    if stripped:
        lead = len(piece) - len(piece.lstrip())
        spans.append(DroppedSpan(start + lead, start + lead + len(stripped), "prose",
                                 stripped))

