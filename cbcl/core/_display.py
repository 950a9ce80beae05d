"""Text from a peer or a user, made safe to print on one line: every character a terminal
would not show as itself is escaped (Trojan Source, log injection). Used by every layer that
logs or shows a peer's value, and by the CLI."""

from __future__ import annotations

import re
import unicodedata

_NOT_PRINTABLE_ASCII = re.compile("[^\x20-\x7e]")
#: Categories never shown raw: controls (C0, DEL, C1), format characters (bidirectional
#: controls, zero-width characters, U+FEFF, tags …), surrogates, private use, unassigned,
#: line and paragraph separators, and spaces other than SP (which look like SP).
_UNSAFE_CATEGORIES = frozenset({"Cc", "Cf", "Cs", "Co", "Cn", "Zl", "Zp", "Zs"})
#: Blank-looking characters of other categories: the combining grapheme joiner, the Hangul
#: fillers, the braille blank.
_UNSAFE_EXTRA = frozenset("\u034f\u115f\u1160\u2800\u3164\uffa0")


def _escape(char: str, quote: bool) -> str:
    """One character as it is shown: itself, or its escape."""
    if " " <= char <= "~":
        return "\\" + char if quote and char in '\\"' else char
    if char not in _UNSAFE_EXTRA and unicodedata.category(char) not in _UNSAFE_CATEGORIES:
        return char
    code = ord(char)
    if code > 0xFFFF:  # a surrogate pair: still a valid JSON escape
        code -= 0x10000
        return f"\\u{0xD800 + (code >> 10):04x}\\u{0xDC00 + (code & 0x3FF):04x}"
    return f"\\u{code:04x}"


def _pieces(chars: str, quote: bool, budget: int) -> tuple[list[str], bool]:
    """The shown form of ``chars``, one piece per character, as many whole pieces as fit in
    ``budget`` characters; and whether all did."""
    pieces: list[str] = []
    size = 0
    for char in chars:
        piece = _escape(char, quote)
        size += len(piece)
        if size > budget:
            return pieces, False
        pieces.append(piece)
    return pieces, True


def escape_invisible(text: str, *, quote: bool = False, limit: int | None = None,
                     tail: int = 0) -> str:
    """``text`` with every character a terminal would not show as itself — controls (C0,
    DEL, C1: LF and CR too), bidirectional controls and the other format characters,
    U+2028/U+2029, spaces other than SP, private-use, unassigned and surrogate code points
    — written as a ``\\uXXXX`` escape (a surrogate pair beyond U+FFFF). So printed text
    never reorders, hides or breaks a line (Trojan Source), and is always one line.

    Applied to JSON text (the default), the JSON value is unchanged. For a value from a
    peer in a log line, ``quote=True`` also escapes ``\\`` and ``"`` (the escapes stay
    unambiguous and a quoted value cannot end early), and ``limit`` shortens the result to
    at most ``limit`` characters and one ``…`` (never cutting an escape): the start of the
    text, or with ``tail`` its start and its last ``tail`` characters around the ``…``."""
    if limit is None:
        if not quote and text.isascii() and text.isprintable():
            return text
        if not quote:
            return _NOT_PRINTABLE_ASCII.sub(lambda m: _escape(m.group(), False), text)
        return "".join(_escape(char, True) for char in text)
    if len(text) <= limit and text.isascii() and text.isprintable() \
            and not (quote and ('"' in text or "\\" in text)):
        return text  # the common case, every character shown as itself
    # Each character shows as one or more: limit + 1 of them are always too many.
    pieces, whole = _pieces(text[:limit + 1], quote, limit)
    if whole:
        return "".join(pieces)
    tail = min(max(tail, 0), limit)
    if tail:
        pieces = _pieces(text[:limit - tail + 1], quote, limit - tail)[0]
        end = _pieces(text[::-1][:tail + 1], quote, tail)[0]
        return "".join(pieces) + "…" + "".join(reversed(end))
    return "".join(pieces) + "…"


def peer_text(value: object, limit: int = 80, *, tail: int = 0) -> str:
    """A value that came from a peer, for one log line: :func:`escape_invisible` with
    ``quote=True``, at most ``limit`` characters and ``…`` (keeping the last ``tail``)."""
    return escape_invisible(str(value), quote=True, limit=limit, tail=tail)
