"""Atheris harness of the encoders' C twins (``cbcl._native``): on every input, the C and
the Python twins give the same canonical text and the same binary frame, or raise the same
exception with the same message.

    pip install '.[fuzz]'
    python tests/fuzz/fuzz_encoders.py [libFuzzer options] [corpus dirs]
    python tests/fuzz/fuzz_encoders.py -max_total_time=180 tests/fuzz/corpus/encoders
    python tests/fuzz/fuzz_encoders.py --replay FILE…   # without atheris (the smoke test)
    python tests/fuzz/fuzz_encoders.py --random N [SEED]   # N seeds, random and mutated inputs

An input is read two ways. As CBCL text (``cbcl.read``): a value that reads is encoded as
it reads. And as a small program that builds a value no reader could return
(:func:`build`): each byte picks an opcode (open a tuple or a list, close it, a string, a
name of each kind built without validation, an int of 1, 8 or 16 bytes, a decimal from
arbitrary text, or a value that is not a CBCL value at all), later bytes its operand;
strings are decoded as UTF-8, or as UTF-16 with ``surrogatepass``, so lone surrogates
occur. Each value is
written by ``canonical_value`` (C first) and ``canonical_value_python``, and sent in a
message body through ``Encoder`` and ``Encoder(pure_python=True)``, and whole messages
holding it (or its items) in envelope fields and a signature too are written by
``Message.canonical`` (C first) and the Python path; any difference is a
finding (an AssertionError: libFuzzer stops and writes the input to ``crash-*``).

Each value also has a *hostile twin* (``tests/hostile.py``: its atoms and lists, as the
input's bytes pick, made instances of subclasses whose methods lie or raise, or members of
enums of them, storing the same data): every writer - canonical text, binary frame, JSON
mapping, ``cbcl.as_value`` - and every whole message holding it must give the twin exactly
what it gives the value, text, frame or error (spec §1.2: values are data, never code).
``tests/fuzz/asan_build.sh`` runs this harness against the extension built with
AddressSanitizer and UBSan.

Tests internals: the C and Python twins (``cbcl.core._canonical``) are private.
"""

from __future__ import annotations

import sys
from decimal import Decimal, InvalidOperation
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent.parent
CORPUS = ROOT / "tests" / "fuzz" / "corpus" / "encoders"
DESCRIPTORS = ("task-assignment-v1", "contract-net-v1", "request-v1", "canon-a-v1")


class _Text(str):
    """A str subclass (not a CBCL type)."""


def _take(data: bytes, at: int, size: int) -> tuple[bytes, int]:
    return data[at:at + size], at + size


def build(data: bytes) -> Any:
    """The value the bytes of ``data`` spell as a program (see the module doc)."""
    from cbcl import URI, Keyword, Symbol

    root: list[Any] = []
    stack: list[tuple[list[Any], type]] = [(root, list)]
    at = 0
    while at < len(data) and len(root) < 2:
        op = data[at] % 16
        at += 1
        items = stack[-1][0]
        if op in (0, 1):  # open a tuple / a list
            if len(stack) < 200:
                stack.append(([], tuple if op == 0 else list))
        elif op == 2:  # close
            if len(stack) > 1:
                done, kind = stack.pop()
                stack[-1][0].append(tuple(done) if kind is tuple else done)
        elif op in (3, 4, 5, 6, 7):  # str, Symbol, Keyword, URI, str subclass
            size = data[at] % 40 if at < len(data) else 0
            raw, at = _take(data, at + 1, size)
            text = raw.decode("utf-8", "replace") if size % 3 == 0 else \
                raw[: len(raw) // 2 * 2].decode("utf-16-le", "surrogatepass")
            kind = (str, Symbol, Keyword, URI, _Text)[op - 3]
            items.append(str.__new__(kind, text))
        elif op in (8, 9, 10):  # int: 1, 8 or 16 bytes, signed
            raw, at = _take(data, at, (1, 8, 16)[op - 8])
            items.append(int.from_bytes(raw, "little", signed=True))
        elif op == 11:  # a decimal from text
            size = data[at] % 24 if at < len(data) else 0
            raw, at = _take(data, at + 1, size)
            try:
                items.append(Decimal(raw.decode("ascii", "replace")))
            except InvalidOperation:
                items.append(Decimal("1E+3"))
        elif op == 12:  # not a CBCL value
            pick = data[at] % 6 if at < len(data) else 0
            at += 1
            items.append((True, None, 1.5, b"x", {"k": 1}, False)[pick])
        elif op == 13:  # deep: a chain of one-item tuples
            depth = int.from_bytes(data[at:at + 2], "little") if at < len(data) else 0
            at += 2
            value: Any = "d"
            # mostly shallow; now and then around the C twin's stack bound (10,000)
            for _ in range(depth % 64 if depth < 0xF000 else 9_996 + depth % 8):
                value = (value,)
            items.append(value)
        else:  # a common atom: a grammar literal, a URI, escapes
            pick = data[at] % 4 if at < len(data) else 0
            at += 1
            items.append((Symbol("request"), Keyword("action"), URI("agent://a/b"),
                          "é\u202a\x85\U0001f600")[pick])
    while len(stack) > 1:
        done, kind = stack.pop()
        stack[-1][0].append(tuple(done) if kind is tuple else done)
    return root[0] if root else ()


def _outcome(fn: Any, *args: Any) -> Any:
    try:
        return fn(*args)
    except Exception as exc:
        return (type(exc), str(exc))


def _equal(a: Any, b: Any) -> bool:
    """``a == b``, of the same types all the way down, without recursion (values may be
    10,000 lists deep, where ``==`` of tuples meets the recursion limit)."""
    pairs = [(a, b)]
    while pairs:
        x, y = pairs.pop()
        if type(x) is not type(y):
            return False
        if type(x) in (tuple, list):
            if len(x) != len(y):
                return False
            pairs.extend(zip(x, y, strict=True))
        elif type(x) is dict:
            if list(x) != list(y):
                return False
            pairs.extend((x[key], y[key]) for key in x)
        elif x != y:
            return False
    return True


def _failed(result: Any) -> bool:
    """Whether ``result`` is what :func:`_outcome` gives for an exception."""
    return type(result) is tuple and len(result) == 2 and isinstance(result[0], type) and \
        issubclass(result[0], Exception)


def _setup() -> Any:
    sys.path.insert(0, str(ROOT / "tests"))
    from hostile import hostile_twin

    import cbcl
    from cbcl import URI, Encoder, Intent, Message, Symbol
    from cbcl.core._canonical import canonical_value, canonical_value_python, native
    from cbcl.json_mapping import to_json
    from cbcl.trust import Signature

    if native is None:
        raise SystemExit("cbcl._native is not built: nothing to compare")
    registry = cbcl.Registry(disk_cache=False, isolate=False)
    for name in DESCRIPTORS:
        registry.load((ROOT / "descriptors" / f"{name}.cbcl").read_bytes(),
                      allow_unsigned=True)
    c_twin = Encoder(registry, validate=False)
    python_twin = Encoder(registry, validate=False, pure_python=True)

    def messages(value: Any) -> list[Any]:
        """Ways a value reaches a whole message: as the body of one made without checks
        (``_trusted``), and as the body and (its items) the fields of one built by
        ``Message`` - a function each, called when compared. (The items are read through
        the base type, as the writers read them: a twin's own methods would lie.)"""
        kind = type(value)
        items = list(tuple.__iter__(value)) if issubclass(kind, tuple) else \
            list(list.__iter__(value)) if issubclass(kind, list) else [value]
        items += [None] * (6 - len(items))

        def built() -> Any:
            return Message(message_id=items[0], sender="agent://a", receiver="agent://b",
                           intent="INFORM", protocol="request/v1", conversation_id=items[1],
                           in_reply_to=items[2], reply_by=items[3], timestamp=items[3],
                           body=value, signature=None if items[4] is None else
                           Signature(items[4], items[5]))

        return [lambda: Message._trusted("m", URI("agent://a"), URI("agent://b"),
                                         Intent.REQUEST, Symbol("request/v1"), None, None,
                                         None, None, value, None), built]

    def same_as_twin(value: Any, twin: Any) -> None:
        """Every writer gives the hostile twin what it gives the value (a ``Message`` of
        fields of the wrong type: an error of the same type; its message may name the
        twin's type)."""
        for write in (canonical_value, canonical_value_python, to_json, cbcl.as_value):
            assert _equal(_outcome(write, twin), _outcome(write, value)), write
        for plain, hostile in zip(messages(value), messages(twin), strict=True):
            for write in (lambda m: m().canonical(), lambda m: c_twin.encode(m()),
                          lambda m: python_twin.encode(m())):
                expected, got = _outcome(write, plain), _outcome(write, hostile)
                if _failed(expected):
                    assert _failed(got) and got[0] is expected[0], (expected, got)
                else:
                    assert got == expected

    def compare(value: Any) -> None:
        expected = _outcome(canonical_value_python, value)
        assert _outcome(canonical_value, value) == expected, value
        text = native.canonical(value)
        assert text is None or (text == expected and text.isascii() == expected.isascii())
        message = Message._trusted("m", URI("agent://a"), URI("agent://b"), Intent.REQUEST,
                                   Symbol("request/v1"), None, None, None, None, value, None)
        assert _outcome(c_twin.encode, message) == _outcome(python_twin.encode, message)
        # whole messages: the value (or its items) in envelope fields and the signature too
        items = list(value) if isinstance(value, (tuple, list)) else [value]
        items += [None] * (6 - len(items))
        for fields in ((items[0], items[1], items[2], items[3]), (value, None, value, None)):
            signature = Signature(items[4], items[5]) if fields[0] is not None else None
            message = Message._trusted(fields[0], URI("agent://a"), URI("agent://b"),
                                       Intent.INFORM, Symbol("request/v1"), fields[1],
                                       fields[2], fields[3], fields[3], value, signature)
            expected = _outcome(lambda m=message: canonical_value_python(m.to_value(), around=2))
            assert _outcome(message.canonical) == expected
            text = native.canonical_message(message)
            assert text is None or text == expected
            for _ in range(2):  # (the second: the protocol's table cached)
                assert _outcome(c_twin.encode, message) == _outcome(python_twin.encode, message)

    def check(data: bytes) -> None:
        try:
            read = cbcl.read(data)
        except cbcl.CBCLError:
            read = None
        if read is not None:
            compare(read)
            same_as_twin(read, hostile_twin(read, data))
        built = build(data)
        compare(built)
        same_as_twin(built, hostile_twin(built, data[::-1]))

    return check


def main(argv: list[str]) -> int:
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    from harness import main as run

    return run(argv, _setup, CORPUS)


if __name__ == "__main__":
    sys.exit(main(sys.argv))
