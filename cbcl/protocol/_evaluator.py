"""The sandboxed evaluator: small expressions such as ``(+ (now) (hours 1))`` over parsed
values (spec/conversations.md §3).

Theory of operation
-------------------
An expression is a CBCL value. Atoms evaluate to themselves (``true`` and ``false`` are the
booleans; any other bare symbol is an error, since there are no variables); a list
``(f arg …)`` applies the library function ``f``, which the caller must allow. Nothing here
touches Python's ``eval``, ``exec`` or ``ast``: the interpreter walks the value with an
explicit stack of frames, so nesting costs heap, never the C stack.

Every evaluated node (each atom and each list, not the function name) costs one step of the
budget, charged *before* the node is evaluated; lazy forms (``if``, ``and``, ``or``) charge
only the branches they take. Nesting beyond ``max_depth`` is refused as soon as the frame
that would exceed it is pushed. Both are :class:`LimitError` (exit 4).

Arithmetic is exact and bounded: every intermediate integer is checked against int64 after
each binary step (the operands are int64, so a step costs O(1)), every intermediate decimal
against the 40-character limit of §1. There is no power function, so no single step can
build a huge number. Other failures are :class:`EvaluationError` (exit 7), with ``path``
naming the offending node: ``$[2][1]`` is the second argument's first argument.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass
from decimal import Decimal
from itertools import pairwise
from typing import Protocol, cast

from ..core._canonical import canonical_value
from ..core._errors import DescriptorError, EvaluationError, LimitError
from ..core._values import INT64_MAX, INT64_MIN, MAX_DECIMAL_CHARS, URI, Keyword, Symbol, Value

TRUE = Symbol("true")
FALSE = Symbol("false")
_BOOLS = (TRUE, FALSE)

DEFAULT_BUDGET = 10_000
DEFAULT_MAX_DEPTH = 32
#: Fractional digits of a decimal quotient before trailing zeros are dropped.
DIVISION_SCALE = 18

_MS = {"seconds": 1_000, "minutes": 60_000, "hours": 3_600_000, "days": 86_400_000}


class _ArgError(Exception):
    """Raised by a library function about one argument (1-based) or the call (0)."""

    def __init__(self, message: str, index: int = 0) -> None:
        super().__init__(message)
        self.index = index


Number = int | Decimal


# --------------------------------------------------------------------------- numbers

def _int(value: int) -> int:
    if not INT64_MIN <= value <= INT64_MAX:
        raise _ArgError(f"integer overflow: the result {_short(value)} is outside int64")
    return value


def _short(value: int) -> str:
    text = str(value)
    return text if len(text) <= 24 else f"{text[:10]}…({len(text)} digits)"


def _dec(value: Decimal) -> Decimal:
    if value.is_zero():
        value = value.copy_abs()  # a zero result is never negative
    try:
        canonical_value(value)
    except ValueError:
        raise _ArgError(f"decimal overflow: the result has more than {MAX_DECIMAL_CHARS} "
                        "characters") from None
    return value


def _scaled(value: Number) -> tuple[int, int]:
    """``value`` as (n, scale) with value = n × 10^-scale, exactly (no context rounding)."""
    if isinstance(value, int):  # (a Number is an int or a Decimal, exactly)
        return value, 0
    sign, digits, exponent = value.as_tuple()
    n = int("".join(map(str, digits)) or "0")
    if sign:
        n = -n
    if isinstance(exponent, int) and exponent >= 0:
        return n * 10**exponent, 0
    return n, -cast(int, exponent)  # (finite: never "n", "N" or "F")


def _from_scaled(n: int, scale: int) -> Decimal:
    """The decimal n × 10^-scale, exactly."""
    return Decimal(f"{n}E-{scale}") if scale else Decimal(n)


def _numbers(args: list[Value]) -> list[Number]:
    for i, arg in enumerate(args, 1):
        if type(arg) is not int and type(arg) is not Decimal:
            raise _ArgError(f"expected a number, got {_kind(arg)}", i)
    return cast("list[Number]", args)  # (each checked above)


def _integers(args: list[Value]) -> list[int]:
    for i, arg in enumerate(args, 1):
        if type(arg) is not int:
            raise _ArgError(f"expected an integer, got {_kind(arg)}", i)
    return cast("list[int]", args)  # (each checked above)


def _exact(value: Number) -> Decimal:
    return Decimal(value) if type(value) is int else cast(Decimal, value)


def _binary(a: Number, b: Number, op: str) -> Number:
    if type(a) is int and type(b) is int:
        if op == "+":
            return _int(a + b)
        if op == "-":
            return _int(a - b)
        return _int(a * b)
    # Operands are at most 40 characters, so the exact result has at most ~80 digits:
    # computed with Python's integers it is never rounded.
    ix, sx = _scaled(a)
    iy, sy = _scaled(b)
    if op == "*":
        return _dec(_from_scaled(ix * iy, sx + sy))
    scale = max(sx, sy)
    ix, iy = ix * 10 ** (scale - sx), iy * 10 ** (scale - sy)
    return _dec(_from_scaled(ix + iy if op == "+" else ix - iy, scale))


def _add(args: list[Value]) -> Value:
    nums = _numbers(args)
    total = nums[0]
    for n in nums[1:]:
        total = _binary(total, n, "+")
    return _dec(total) if type(total) is Decimal else total


def _sub(args: list[Value]) -> Value:
    nums = _numbers(args)
    if len(nums) == 1:
        return _binary(0, nums[0], "-")
    total = nums[0]
    for n in nums[1:]:
        total = _binary(total, n, "-")
    return total


def _mul(args: list[Value]) -> Value:
    nums = _numbers(args)
    total = nums[0]
    for n in nums[1:]:
        total = _binary(total, n, "*")
    return _dec(total) if type(total) is Decimal else total


def _div(args: list[Value]) -> Value:
    a, b = _numbers(args)
    if b == 0:
        raise _ArgError("division by zero", 2)
    if type(a) is int and type(b) is int:
        q = abs(a) // abs(b)  # truncation toward zero
        return _int(q if (a < 0) == (b < 0) else -q)
    ix, sx = _scaled(a)
    iy, sy = _scaled(b)
    # a/b = (ix·10^-sx) / (iy·10^-sy); scaled by 10^DIVISION_SCALE and rounded half-even.
    num = abs(ix) * 10 ** (sy + DIVISION_SCALE)
    den = abs(iy) * 10 ** sx
    q, r = divmod(num, den)
    if 2 * r > den or (2 * r == den and q % 2 == 1):
        q += 1
    if (ix < 0) != (iy < 0):
        q = -q
    scale = DIVISION_SCALE
    while scale > 1 and q % 10 == 0:
        q //= 10
        scale -= 1
    return _dec(_from_scaled(q, scale))


def _compare(args: list[Value], test: Callable[[Number, Number], bool]) -> Value:
    nums = _numbers(args)
    ok = all(test(_exact(a), _exact(b)) for a, b in pairwise(nums))
    return TRUE if ok else FALSE


def _same(a: Value, b: Value) -> bool:
    if type(a) in (int, Decimal) and type(b) in (int, Decimal):
        return _exact(cast(Number, a)) == _exact(cast(Number, b))
    if type(a) is not type(b):
        return False
    return a == b if type(a) is not tuple else canonical_value(a) == canonical_value(b)


def _eq(args: list[Value]) -> Value:
    return TRUE if all(_same(a, b) for a, b in pairwise(args)) else FALSE


def _ne(args: list[Value]) -> Value:
    a, b = args
    return FALSE if _same(a, b) else TRUE


def _not(args: list[Value]) -> Value:
    (a,) = args
    if a not in _BOOLS:
        raise _ArgError(f"expected a boolean (true or false), got {_kind(a)}", 1)
    return FALSE if a == TRUE else TRUE


def _pick(args: list[Value], better: Callable[[Decimal, Decimal], bool]) -> Value:
    nums = _numbers(args)
    best = nums[0]
    for n in nums[1:]:
        if better(_exact(n), _exact(best)):
            best = n
    return best


def _time(unit: str) -> Callable[[list[Value]], Value]:
    factor = _MS[unit]

    def apply(args: list[Value]) -> Value:
        (n,) = _integers(args)
        return _int(n * factor)

    return apply


@dataclass(frozen=True, slots=True)
class Function:
    """A library function: its arity (``max_args`` ``None`` for any number) and, for a
    strict function, how it applies to evaluated arguments. ``lazy`` functions (``if``,
    ``and``, ``or``) are interpreted by the evaluator itself."""

    name: str
    min_args: int
    max_args: int | None
    apply: Callable[[list[Value]], Value] | None = None
    lazy: bool = False

    def arity(self) -> str:
        if self.max_args == self.min_args:
            return f"exactly {self.min_args}"
        if self.max_args is None:
            return f"at least {self.min_args}"
        return f"{self.min_args} to {self.max_args}"


def _fn(name: str, lo: int, hi: int | None, apply: Callable[[list[Value]], Value] | None = None,
        lazy: bool = False) -> Function:
    return Function(name, lo, hi, apply, lazy)


#: The built-in library, by name. A descriptor's ``(functions …)`` picks from these.
LIBRARY: dict[str, Function] = {f.name: f for f in (
    _fn("+", 1, None, _add),
    _fn("-", 1, None, _sub),
    _fn("*", 1, None, _mul),
    _fn("/", 2, 2, _div),
    _fn("=", 2, None, _eq),
    _fn("!=", 2, 2, _ne),
    _fn("<", 2, None, lambda a: _compare(a, lambda x, y: x < y)),
    _fn("<=", 2, None, lambda a: _compare(a, lambda x, y: x <= y)),
    _fn(">", 2, None, lambda a: _compare(a, lambda x, y: x > y)),
    _fn(">=", 2, None, lambda a: _compare(a, lambda x, y: x >= y)),
    _fn("min", 1, None, lambda a: _pick(a, lambda x, y: x < y)),
    _fn("max", 1, None, lambda a: _pick(a, lambda x, y: x > y)),
    _fn("and", 1, None, lazy=True),
    _fn("or", 1, None, lazy=True),
    _fn("not", 1, 1, _not),
    _fn("if", 3, 3, lazy=True),
    _fn("now", 0, 0, lazy=True),
    *(_fn(unit, 1, 1, _time(unit)) for unit in _MS),
)}


# --------------------------------------------------------------------------- functions

def _kind(value: object) -> str:
    if type(value) is tuple:
        return "a list"
    if value in _BOOLS:
        return f"the boolean {value}"
    return {str: "a string", int: "an integer", Decimal: "a decimal", Symbol: "a symbol",
            Keyword: "a keyword", URI: "a URI"}.get(type(value), type(value).__name__)


def read_functions(section: Value) -> frozenset[str]:
    """The function names of a ``(functions NAME …)`` section, checked: each a symbol that
    names a library function, none repeated. Raises :class:`DescriptorError`."""
    if type(section) is not tuple or not section or section[0] != Symbol("functions"):
        raise DescriptorError("descriptor: expected a (functions …) section")
    names: list[str] = []
    for i, item in enumerate(section[1:], 1):
        if type(item) is not Symbol:
            raise DescriptorError(f"descriptor: (functions …) item {i} is "
                                  f"{_kind(item)}, not a function name")
        if str(item) not in LIBRARY:
            raise DescriptorError(f"descriptor: (functions …) names {item}, which is not a "
                                  "library function (known: " + " ".join(LIBRARY) + ")")
        if str(item) in names:
            raise DescriptorError(f"descriptor: (functions …) names {item} twice")
        names.append(str(item))
    return frozenset(names)  # (not memoized: a descriptor's section is read once)


def _allowed(functions: object) -> frozenset[str]:
    if functions is None:
        return frozenset(LIBRARY)
    if type(functions) is tuple and functions and functions[0] == Symbol("functions"):
        return read_functions(functions)
    if isinstance(functions, (str, bytes)) or not isinstance(functions, Iterable):
        raise TypeError("functions must be a (functions …) section, an iterable of names, "
                        "or None")
    names = frozenset(str(name) for name in functions)
    unknown = sorted(names - LIBRARY.keys())
    if unknown:
        raise ValueError("not library functions: " + " ".join(unknown))
    return names


# --------------------------------------------------------------------------- interpreter

class Absent(Exception):
    """Raised by a :class:`Context` for data that is not there (a body member, an envelope
    field, an earlier message); the evaluator reports it as :class:`AbsentError`."""


class AbsentError(EvaluationError):
    """An expression read data the message does not have (spec/conversations.md §5.3)."""


class Context(Protocol):
    """The data an expression's context forms read (spec/conversations.md §5.2):
    ``lookup(form, args)`` is the value of ``(field …)``, ``(has …)``, ``(head)``,
    ``(envelope …)``, ``(has-envelope …)``, ``(seen …)`` or ``(quote …)`` with its
    unevaluated ``args``; ``earlier(intent)``
    the context of the conversation's most recent earlier message of ``intent``. Both raise
    :class:`Absent` for data that is not there and ``ValueError`` for a malformed form."""

    def lookup(self, form: str, args: tuple[Value, ...]) -> Value: ...

    def earlier(self, intent: Value) -> Context: ...


#: The context forms: not library functions, data bound by name (spec/conversations.md §5).
CONTEXT_FORMS = frozenset(("field", "has", "head", "envelope", "has-envelope", "seen",
                           "earlier", "quote"))
_EARLIER = Function("earlier", 2, 2, lazy=True)


class _Frame:
    """One call being evaluated: its list, its function, the arguments evaluated so far and
    the index (into the list) of the child being evaluated now; for ``(earlier …)``, the
    context to restore when it returns."""

    __slots__ = ("args", "expr", "fn", "index", "saved")

    def __init__(self, expr: tuple[Value, ...], fn: Function) -> None:
        self.expr = expr
        self.fn = fn
        self.args: list[Value] = []
        self.index = 0
        self.saved: Context | None = None


def _path(base: str, stack: list[_Frame], extra: int | None = None) -> str:
    parts = [base, *(f"[{frame.index}]" for frame in stack)]
    if extra is not None:
        parts.append(f"[{extra}]")
    return "".join(parts)


def _atom(value: Value) -> Value:
    """An atom's value; raises ``ValueError`` for a bare symbol, ``TypeError`` for a
    non-CBCL object."""
    kind = type(value)
    if kind is Symbol:
        if value in _BOOLS:
            return value
        raise ValueError(f"unbound symbol {value}: there are no variables (write a string, "
                         "or true/false)")
    if kind is int:
        if not INT64_MIN <= cast(int, value) <= INT64_MAX:
            raise ValueError("integer outside int64")
        return value
    if kind is Decimal:
        canonical_value(value)  # refuses non-finite and over-long decimals (ValueError)
        return value
    if kind in (str, Keyword, URI):
        return value
    raise TypeError(f"{kind.__name__} is not a CBCL value")


def evaluate(value: Value, *, functions: object = None, now: int | None = None,
             budget: int = DEFAULT_BUDGET, max_depth: int = DEFAULT_MAX_DEPTH,
             path: str = "$", context: Context | None = None) -> Value:
    """Evaluate an expression and return its value (an atom that prints canonically).

    ``functions``: the descriptor's ``(functions …)`` section, an iterable of names, or
    ``None`` for the whole built-in library. ``now``: the current time in Unix
    milliseconds, the value of ``(now)``; ``None`` makes ``(now)`` an error. ``budget``:
    steps (evaluated nodes); ``max_depth``: calls nested at once. ``path``: the prefix of
    error paths (``$.body.task[:deadline]``). ``context``: the data the context forms
    (``field``, ``earlier`` …, spec/conversations.md §5) read; without one they are unknown
    functions.

    Raises :class:`LimitError` when the budget or depth is exceeded, and
    :class:`EvaluationError` (with ``path``) for everything else that fails: an unknown or
    not-allowed function, a wrong argument count or type, an unbound symbol, overflow,
    division by zero. Raises ``TypeError``/``ValueError`` for bad arguments to this function.
    """
    return run(value, _allowed(functions), now, budget, max_depth, path, context)[0]


def run(value: Value, allowed: frozenset[str], now: int | None, budget: int,
        max_depth: int, path: str, context: Context | None) -> tuple[Value, int]:
    """:func:`evaluate` with the allowed names checked already: the value and the steps it
    took. Raises as :func:`evaluate`; :class:`AbsentError` for data a context lacks."""
    if type(budget) is not int or budget < 1:
        raise ValueError("budget must be a positive int")
    if type(max_depth) is not int or max_depth < 1:
        raise ValueError("max_depth must be a positive int")
    if now is not None and (type(now) is not int or not INT64_MIN <= now <= INT64_MAX):
        raise ValueError("now must be an int64 of Unix milliseconds, or None")

    stack: list[_Frame] = []
    steps = 0
    node: Value = value
    result: Value  # (always set before `evaluating` turns False, which is when it is read)
    evaluating = True  # True: evaluate `node`; False: hand `result` to the top frame

    def fail(message: str, extra: int | None = None) -> EvaluationError:
        where = _path(path, stack, extra)
        return EvaluationError(f"{where}: {message}", path=where)

    while True:
        if evaluating:
            steps += 1
            if steps > budget:
                raise LimitError(f"evaluation budget of {budget} steps exhausted at "
                                 f"{_path(path, stack)}", limit="budget", maximum=budget)
            if type(node) is tuple:
                if len(stack) >= max_depth:
                    raise LimitError(f"expression nested more than {max_depth} calls deep "
                                     f"at {_path(path, stack)}", limit="max_depth",
                                     maximum=max_depth)
                if not node:
                    raise fail("an empty list is not an expression")
                head = node[0]
                if type(head) is not Symbol:
                    raise fail(f"a call starts with a function name, not {_kind(head)}")
                fn = LIBRARY.get(str(head))
                if fn is None:
                    if context is None or str(head) not in CONTEXT_FORMS:
                        raise fail(f"unknown function {head}")
                    try:
                        if str(head) == "earlier":
                            if len(node) != 3:
                                raise ValueError("earlier takes an intent and an expression")
                            inner = context.earlier(node[1])
                        else:
                            result, evaluating = context.lookup(str(head), node[1:]), False
                            continue
                    except Absent as exc:
                        where = _path(path, stack)
                        raise AbsentError(f"{where}: {exc}", path=where) from None
                    except ValueError as exc:
                        raise fail(str(exc)) from None
                    frame = _Frame(node, _EARLIER)
                    frame.index, frame.saved, context = 2, context, inner
                    stack.append(frame)
                    node = node[2]
                    continue
                if fn.name not in allowed:
                    raise fail(f"function {head} is not allowed here (allowed: "
                               + (" ".join(n for n in LIBRARY if n in allowed) or "none") + ")")
                count = len(node) - 1
                if count < fn.min_args or (fn.max_args is not None and count > fn.max_args):
                    raise fail(f"{head} takes {fn.arity()} argument"
                               f"{'' if fn.max_args == 1 else 's'}, not {count}")
                if fn.name == "now":
                    if now is None:
                        raise fail("(now) is not available: no time was given")
                    result, evaluating = now, False
                    continue
                frame = _Frame(node, fn)
                frame.index = 1
                stack.append(frame)
                node = node[1]
                continue
            try:
                result = _atom(node)
            except ValueError as exc:
                raise fail(str(exc)) from None
            evaluating = False
            continue

        # Hand `result` to the innermost call.
        if not stack:
            return result, steps
        frame = stack[-1]
        name = frame.fn.name
        if frame.fn is _EARLIER:  # its expression's value, in the context it left
            context = frame.saved
            stack.pop()
            continue
        if frame.fn.lazy:
            if result not in _BOOLS and (name != "if" or frame.index == 1):
                raise fail(f"{name} expects a boolean (true or false), got {_kind(result)}")
            if name == "if":
                if frame.index == 1:
                    frame.index = 2 if result == TRUE else 3
                    node, evaluating = frame.expr[frame.index], True
                    continue
                stack.pop()  # the branch's value is the value of the if
                continue
            decided = (result == FALSE) if name == "and" else (result == TRUE)
            if decided or frame.index == len(frame.expr) - 1:
                stack.pop()
                continue
            frame.index += 1
            node, evaluating = frame.expr[frame.index], True
            continue
        frame.args.append(result)
        if frame.index < len(frame.expr) - 1:
            frame.index += 1
            node, evaluating = frame.expr[frame.index], True
            continue
        assert frame.fn.apply is not None
        try:
            result = frame.fn.apply(frame.args)
        except _ArgError as exc:
            frame.index = exc.index
            if exc.index == 0:
                stack.pop()
                raise fail(f"{name}: {exc}") from None
            raise fail(f"{name}: argument {exc.index}: {exc}") from None
        stack.pop()
