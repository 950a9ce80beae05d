"""Constraints: a descriptor's business rules over a message's fields and its conversation
(spec/conversations.md §5).

Theory of operation
-------------------
A ``(constraints (rule NAME (intents I …) (check EXPR) (message "…")) …)`` section is read
once, when the descriptor is (:func:`read_constraints`): every rule's shape, its intents
(governed ones), the forms and arities of its expression, and every library function it
calls (listed in the descriptor's ``(functions …)``) are checked statically, with bounds
on rules, nodes, depth and message length. Nothing is left to discover at run time but
the data: a rule that loaded can only fail on a message for what the message holds.

A rule's check is an evaluator expression (:mod:`._evaluator`) with *context forms* that
read the message being judged: ``(field :k …)``, ``(has :k …)``, ``(envelope NAME)``,
``(has-envelope NAME)``, and — where a conversation is tracked — ``(earlier INTENT
EXPR)`` (EXPR against the most recent earlier message of INTENT in the thread) and
``(seen INTENT)``. A rule is *stateless* when it uses neither of the last two: those are
checked wherever a message is (``parse``, ``validate``, the binary codec, a sender's
``check_outgoing``); the others only by a :class:`~._conversation.Conversation`, which
keeps, per intent an ``earlier`` names, the values the rules read of its latest message
(:class:`Snapshot`) and nothing else.

Rules of an intent run in order against one step budget per message (:data:`MAX_STEPS`
all rules together); each step is one evaluated node, so the work per message is bounded
by a constant. A rule holds when its check is ``true``; ``false``, another value, an
evaluation error or an absent datum refuses the message with :class:`ConstraintError`
(the rule's name and message); the budget running out is :class:`LimitError`.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, cast

from ..core._canonical import canonical_value
from ..core._errors import DescriptorError, EvaluationError, LimitError, SchemaError
from ..core._values import Keyword, Symbol, Value
from ._evaluator import (
    CONTEXT_FORMS,
    DEFAULT_MAX_DEPTH,
    FALSE,
    LIBRARY,
    TRUE,
    Absent,
    AbsentError,
    Context,
    _ArgError,
    _atom,
    _kind,
    _same,
    read_functions,
    run,
)
from ._message import Intent, Message

#: Rules per descriptor.
MAX_RULES = 32
#: Values in one rule's check expression (every atom and list, function names included).
MAX_RULE_NODES = 256
#: Characters of a rule's refusal message.
MAX_MESSAGE_CHARS = 256
#: Evaluation steps per message, all the rules of its intent together.
MAX_STEPS = 4096
#: Calls nested at once in a check (the evaluator's depth).
MAX_RULE_DEPTH = DEFAULT_MAX_DEPTH

#: ``(envelope NAME)`` -> the :class:`Message` attribute it reads.
ENVELOPE_FIELDS = {
    "message-id": "message_id", "sender": "sender", "receiver": "receiver",
    "conversation-id": "conversation_id", "in-reply-to": "in_reply_to",
    "reply-by": "reply_by", "timestamp": "timestamp",
}
_MISSING: Any = object()


class ConstraintError(SchemaError):
    """A message that breaks a rule of its protocol's ``(constraints …)``: kind
    ``constraint``, exit 7, wire reason ``schema``. ``rule`` is the rule's name and
    ``refusal`` its message."""

    kind = "constraint"

    def __init__(self, message: str, *, rule: str, refusal: str, path: str = "$.body") -> None:
        super().__init__(message, path=path)
        self.rule = rule
        self.refusal = refusal


@dataclass(frozen=True, slots=True)
class Rule:
    """One rule as loaded: ``earlier`` is the intents its ``(earlier …)``/``(seen …)`` forms
    name (empty: a stateless rule)."""

    name: str
    intents: tuple[Intent, ...]
    check: Value
    message: str
    earlier: frozenset[Intent] = frozenset()
    #: The check compiled to closures (:func:`_compile`), as the evaluator would run it.
    compiled: Compiled | None = field(default=None, compare=False, repr=False)

    def describe(self) -> str:
        """The rule in words, for prompts: its intents, its check stated in words, and
        its message (canonical text: quotes and newlines escaped)."""
        intents = ", ".join(i.value for i in self.intents)
        return f"{intents}: {in_words(self.check)} (else refused: " \
               f"{canonical_value(self.message)})"


#: What a rule reads of an earlier message: ("field", path), ("envelope", (name,)) or
#: ("head", ()).
Read = tuple[str, tuple[str, ...]]


@dataclass(frozen=True, slots=True)
class Constraints:
    """A descriptor's rules, compiled: by intent, the stateless and the conversation ones,
    the functions they may call, and per intent an ``earlier`` names, what they read."""

    rules: tuple[Rule, ...]
    functions: frozenset[str]
    stateless: dict[Intent, tuple[Rule, ...]] = field(init=False)
    stateful: dict[Intent, tuple[Rule, ...]] = field(init=False)
    reads: dict[Intent, frozenset[Read]] = field(default_factory=dict)
    #: Per intent, its stateless rules as unmetered tests (:func:`_plan`), or ``None``
    #: where they must run metered (a rule made by hand, or a worst case over the budget).
    fast: dict[Intent, tuple[tuple[Rule, _Test], ...] | None] = field(
        init=False, compare=False, repr=False)

    def __post_init__(self) -> None:
        stateless: dict[Intent, list[Rule]] = {}
        stateful: dict[Intent, list[Rule]] = {}
        for rule in self.rules:
            for intent in rule.intents:
                (stateful if rule.earlier else stateless).setdefault(intent, []).append(rule)
        object.__setattr__(self, "stateless", {k: tuple(v) for k, v in stateless.items()})
        object.__setattr__(self, "stateful", {k: tuple(v) for k, v in stateful.items()})
        object.__setattr__(self, "fast", {k: _plan(v) for k, v in self.stateless.items()})

    def check(self, message: Message) -> None:
        """Apply the stateless rules of the message's intent. Raises
        :class:`ConstraintError` for a rule that does not hold, :class:`LimitError` when
        the rules exceed :data:`MAX_STEPS`."""
        plan = self.fast.get(message.intent, _NO_RULES)
        if plan is None:
            _apply(self.stateless[message.intent], _MessageContext(message, None),
                   self.functions)
            return
        body = message.body
        for rule, test in plan:
            try:
                if test(body, message):
                    continue
            except (_Fallback, _ArgError):
                pass
            # Not shown to hold: the reference judges this rule alone, and raises what the
            # metered run of all the rules would (the earlier ones held; no run of these
            # rules can exhaust the budget, or there would be no plan).
            _apply((rule,), _MessageContext(message, None), self.functions)

    def check_in_conversation(self, message: Message,
                              history: dict[Intent, Snapshot]) -> None:
        """Apply the rules with ``(earlier …)``/``(seen …)`` of the message's intent, with
        ``history`` the thread's latest snapshot per intent. Raises as :meth:`check`."""
        rules = self.stateful.get(message.intent)
        if rules:
            _apply(rules, _MessageContext(message, history), self.functions)

    def remember(self, message: Message, history: dict[Intent, Snapshot]) -> None:
        """Record in ``history`` what the rules will read of ``message`` later (only for
        an intent an ``(earlier …)`` or ``(seen …)`` names)."""
        reads = self.reads.get(message.intent)
        if reads is not None:
            history[message.intent] = Snapshot.of(message, reads)


@dataclass(frozen=True, slots=True)
class Snapshot:
    """The values the rules read of one earlier message: by (form, path), or absent."""

    values: dict[Read, Value]

    @classmethod
    def of(cls, message: Message, reads: frozenset[Read]) -> Snapshot:
        values: dict[Read, Value] = {}
        for read in reads:
            kind, path = read
            body = message.body
            if kind == "head":
                found = body[0] if type(body) is tuple and body else _MISSING
            else:
                found = _member(body, path) if kind == "field" \
                    else getattr(message, ENVELOPE_FIELDS[path[0]])
            if found is not _MISSING and found is not None:
                values[read] = found
        return cls(values)


def _apply(rules: tuple[Rule, ...], context: Context, functions: frozenset[str]) -> None:
    meter = _Meter(MAX_STEPS)
    for rule in rules:
        try:
            if rule.compiled is not None:
                value = rule.compiled(context, meter)
            else:  # (a Rule made by hand: the evaluator runs it)
                value, steps = run(rule.check, functions, None, max(meter.left, 1),
                                   MAX_RULE_DEPTH, "$", context)
                meter.left -= steps
        except (_OutOfSteps, LimitError):
            raise LimitError(f"constraints: the budget of {MAX_STEPS} evaluation steps per "
                             f"message ran out in rule {rule.name}", limit="constraint_steps",
                             maximum=MAX_STEPS) from None
        except AbsentError as exc:
            raise _refused(rule, str(exc).split(": ", 1)[-1]) from None
        except EvaluationError as exc:
            raise _refused(rule, f"its check failed: {exc.message}") from None
        if value is not TRUE and value != TRUE:
            raise _refused(rule, None if value == FALSE else
                           f"its check gave {_short(value)}, not a boolean")


# ---------------------------------------------------------------- checks compiled to closures
#
# A loaded check becomes a tree of closures, one per node, that does what the evaluator
# (_evaluator.run) does with it: one step charged per evaluated node before it is
# evaluated (the meter counts down from the budget per message), lazy if/and/or, the
# library's functions applied to evaluated arguments, context forms read through the
# Context, and the same errors with the same paths. Its nesting is bounded at load
# (MAX_RULE_DEPTH), so the recursion is too. tests/test_constraints.py holds the two to the
# same results on random checks.

class _OutOfSteps(Exception):
    """The meter ran out (the caller raises the LimitError)."""


class _Meter:
    __slots__ = ("left",)

    def __init__(self, left: int) -> None:
        self.left = left


Compiled = Callable[[Context, _Meter], Value]


def _bool_error(where: str, name: str, value: Value) -> EvaluationError:
    return EvaluationError(f"{where}: {name} expects a boolean (true or false), got "
                           f"{_kind(value)}", path=where)


def _compile(expr: Value, path: str = "$") -> Compiled:
    """The closures of a check that :func:`read_constraints` accepted."""
    if type(expr) is not tuple:
        value = _atom(expr)

        def atom(context: Context, meter: _Meter) -> Value:
            meter.left -= 1
            if meter.left < 0:
                raise _OutOfSteps
            return value
        return atom
    name, args = str(expr[0]), expr[1:]
    if name in CONTEXT_FORMS:
        if name == "earlier":
            intent, inner = args[0], _compile(args[1], f"{path}[2]")

            def earlier(context: Context, meter: _Meter) -> Value:
                meter.left -= 1
                if meter.left < 0:
                    raise _OutOfSteps
                try:
                    other = context.earlier(intent)
                except Absent as exc:
                    raise AbsentError(f"{path}: {exc}", path=path) from None
                return inner(other, meter)
            return earlier

        def form(context: Context, meter: _Meter) -> Value:
            meter.left -= 1
            if meter.left < 0:
                raise _OutOfSteps
            try:
                return context.lookup(name, args)
            except Absent as exc:
                raise AbsentError(f"{path}: {exc}", path=path) from None
            except ValueError as exc:
                raise EvaluationError(f"{path}: {exc}", path=path) from None
        return form
    children = [_compile(arg, f"{path}[{i}]") for i, arg in enumerate(args, 1)]
    if name == "if":
        test, then, otherwise = children

        def if_(context: Context, meter: _Meter) -> Value:
            meter.left -= 1
            if meter.left < 0:
                raise _OutOfSteps
            decided = test(context, meter)
            if decided == TRUE:
                return then(context, meter)
            if decided == FALSE:
                return otherwise(context, meter)
            raise _bool_error(f"{path}[1]", "if", decided)
        return if_
    if name in ("and", "or"):
        stop = FALSE if name == "and" else TRUE

        def logic(context: Context, meter: _Meter) -> Value:
            meter.left -= 1
            if meter.left < 0:
                raise _OutOfSteps
            result: Value = stop
            for index, child in enumerate(children, 1):
                result = child(context, meter)
                if result != TRUE and result != FALSE:
                    raise _bool_error(f"{path}[{index}]", name, result)
                if result == stop:
                    return result
            return result
        return logic
    apply = LIBRARY[name].apply
    if apply is None:  # pragma: no cover - (now) is refused at load
        raise DescriptorError(f"descriptor: {path}: {name} cannot be compiled")

    def call(context: Context, meter: _Meter) -> Value:
        meter.left -= 1
        if meter.left < 0:
            raise _OutOfSteps
        values = [child(context, meter) for child in children]
        try:
            return apply(values)
        except _ArgError as exc:
            if exc.index == 0:
                raise EvaluationError(f"{path}: {name}: {exc}", path=path) from None
            where = f"{path}[{exc.index}]"
            raise EvaluationError(f"{where}: {name}: argument {exc.index}: {exc}",
                                  path=where) from None
    return call


# ---------------------------------------------------------------- the unmetered fast path
#
# The closures above are exact but pay for it per node: a step charged, a call per atom, a
# Context method per form, the form's arguments checked again at every message. Most rule
# sets can skip all of that. The steps a check takes depend on the data only through the
# branches if/and/or take, so its worst case is known at load (_worst_steps); where the
# worst cases of all the stateless rules of an intent together fit in MAX_STEPS, no message
# can exhaust the budget, and the meter is dropped for that intent (the budget is counted
# exactly as before, and provably never runs out there). Each rule then becomes a *test*:
# a closure over (body, message) that answers True only when the rule's check evaluates to
# ``true`` — with keyword paths resolved at load, constants folded (a call on constants is
# applied once, at load, when that succeeds), ``(head)``, ``(has …)`` and comparisons of a
# field with a constant specialised. A test may answer False, or raise _Fallback or
# _ArgError, for anything else (false, a non-boolean, absent data, a bad argument): the
# rule is then judged again by the metered closures alone, which give the exact verdict
# and error. So the fast path only has to be sound when it says "holds"; its refusals cost
# one more (bounded) evaluation of the one rule that failed. Rules with earlier/seen keep
# the metered closures (the conversation tracker).

class _Fallback(Exception):
    """A fast test met something it does not judge itself (the reference will)."""


_FastValue = Callable[[Any, Message], Value]  # (body, message): the body is any Value
_Test = Callable[[Any, Message], bool]
_NO_RULES: tuple[tuple[Rule, _Test], ...] = ()
_FALLBACK = _Fallback()
_HEAD: Value = (Symbol("head"),)


def _worst_steps(expr: Value) -> int:
    """The most steps the evaluator can spend on a loaded check (depth bounded at load)."""
    if type(expr) is not tuple:
        return 1
    name = str(expr[0])
    if name == "earlier":
        return 1 + _worst_steps(expr[2])
    if name in CONTEXT_FORMS:
        return 1
    children = [_worst_steps(arg) for arg in expr[1:]]
    if name == "if":
        return 1 + children[0] + max(children[1], children[2])
    return 1 + sum(children)


def _plan(rules: tuple[Rule, ...]) -> tuple[tuple[Rule, _Test], ...] | None:
    """An intent's stateless rules as fast tests, or ``None`` where they must run metered:
    a rule not loaded by :func:`read_constraints`, or worst cases over :data:`MAX_STEPS`."""
    if any(rule.compiled is None for rule in rules) or \
            sum(_worst_steps(rule.check) for rule in rules) > MAX_STEPS:
        return None
    return tuple((rule, _test(rule.check)) for rule in rules)


def _member_of(path: tuple[str, ...]) -> Callable[[Value], Any]:
    """:func:`_member` with its path fixed (one key: :func:`_member_at` itself, the key's
    interned keyword looked for by identity first)."""
    if len(path) != 1:
        return lambda body: _member(body, path)
    # (the interned object, where the reader has one)
    return functools.partial(_member_at, key=path[0], keyword=Keyword(path[0]))


def _bool(value: Value) -> Value:
    """``value``, as the very object :data:`TRUE` or :data:`FALSE` where it equals one (so
    that the fast tests compare by identity)."""
    if value is TRUE or value is FALSE or type(value) is not Symbol:
        return value
    return TRUE if value == TRUE else FALSE if value == FALSE else value


def _constant(expr: Value) -> tuple[bool, Value | None]:
    """(True, its value) for an expression whose value is known at load, else (False, …)."""
    if type(expr) is not tuple:
        return True, _bool(_atom(expr))
    name = str(expr[0])
    if name == "quote":
        return True, _bool(expr[1])
    if name in CONTEXT_FORMS or name in ("if", "and", "or"):
        return False, None
    args: list[Value] = []
    for arg in expr[1:]:
        known, value = _constant(arg)
        if not known:
            return False, None
        args.append(cast(Value, value))
    apply = LIBRARY[name].apply
    assert apply is not None  # ((now) is refused at load; the lazy ones are above)
    try:
        return True, _bool(apply(args))
    except _ArgError:
        return False, None  # (an error: left to run time, and so to the reference)


def _fast_value(expr: Value) -> _FastValue:
    """The value of a loaded stateless expression, or :class:`_Fallback`/_ArgError."""
    known, constant = _constant(expr)
    if known:
        return lambda body, message: cast(Value, constant)
    assert type(expr) is tuple
    name, args = str(expr[0]), expr[1:]
    if name == "field":
        member = _member_of(_path_of(args))

        def field_(body: Value, message: Message) -> Value:
            found = member(body)
            if found is _MISSING:
                raise _FALLBACK
            return found  # type: ignore[no-any-return]
        return field_
    if name == "head":
        def head(body: Value, message: Message) -> Value:
            if type(body) is not tuple or not body:
                raise _FALLBACK
            return body[0]
        return head
    if name in ("envelope", "has-envelope"):
        attribute = ENVELOPE_FIELDS[_envelope_name(args)]
        if name == "has-envelope":
            return lambda body, message: FALSE if getattr(message, attribute) is None \
                else TRUE

        def envelope(body: Value, message: Message) -> Value:
            value = getattr(message, attribute)
            if value is None:
                raise _FALLBACK
            return value  # type: ignore[no-any-return]
        return envelope
    if name in ("has", "and", "or", "not"):  # (tests that are exact both ways)
        test = _test(expr)
        return lambda body, message: TRUE if test(body, message) else FALSE
    children = [_fast_value(arg) for arg in args]
    if name == "if":
        decide, then, otherwise = children

        def if_(body: Value, message: Message) -> Value:
            decided = decide(body, message)
            if decided is TRUE or (decided is not FALSE and decided == TRUE):
                return then(body, message)
            if decided is FALSE or decided == FALSE:
                return otherwise(body, message)
            raise _FALLBACK
        return if_
    apply = LIBRARY[name].apply
    assert apply is not None
    return lambda body, message: apply([child(body, message) for child in children])


_ORDER: dict[str, Callable[[Any, Any], bool]] = {
    "<": lambda a, b: a < b, "<=": lambda a, b: a <= b,
    ">": lambda a, b: a > b, ">=": lambda a, b: a >= b}


def _test(expr: Value) -> _Test:
    """A loaded stateless check as a fast test: ``True`` only when it evaluates to
    ``true``; ``False``, :class:`_Fallback` or ``_ArgError`` otherwise (the caller then asks
    the reference). Where a test returns ``False`` for a check whose value is ``false``,
    it is exact too (``not``, ``and`` and ``or`` rely on it)."""
    known, constant = _constant(expr)
    if known:
        holds = constant is TRUE
        return lambda body, message: holds
    assert type(expr) is tuple
    name, args = str(expr[0]), expr[1:]
    if name == "has":
        member = _member_of(_path_of(args))
        return lambda body, message: member(body) is not _MISSING
    if name == "=" and len(args) == 2 and (args[0] == _HEAD or args[1] == _HEAD):
        known, fixed = _constant(args[1] if args[0] == _HEAD else args[0])
        if known and type(fixed) is Symbol:  # (= (head) (quote query)): one read
            def head_is(body: Value, message: Message) -> bool:
                return type(body) is tuple and len(body) > 0 and \
                    type(head := body[0]) is Symbol and \
                    (head is fixed or str.__str__(head) == str.__str__(fixed))
            return head_is
    if name == "not":
        inner = _fast_value(args[0])

        def not_(body: Value, message: Message) -> bool:
            value = inner(body, message)
            if value is FALSE or (value is not TRUE and value == FALSE):
                return True
            if value is TRUE or value == TRUE:
                return False
            raise _FALLBACK
        return not_
    if name in ("and", "or"):
        values = [_fast_value(arg) for arg in args]
        stop = FALSE if name == "and" else TRUE

        def logic(body: Value, message: Message) -> bool:
            result: Value = stop
            for value in values:
                result = value(body, message)
                if result is not TRUE and result is not FALSE:
                    result = _bool(result)  # (a true or false read from the body)
                    if result is not TRUE and result is not FALSE:
                        raise _FALLBACK
                if result is stop:
                    break
            return result is TRUE
        return logic
    if name in ("=", "!=") and len(args) == 2:
        left, right = (_constant(arg) for arg in args)
        if left[0] or right[0]:  # a datum against a constant (the other side is not one)
            fixed = cast(Value, left[1] if left[0] else right[1])
            other = _fast_value(args[1] if left[0] else args[0])
            equal = name == "="
            if type(fixed) is Symbol:  # (= (head) (quote query)): type and text
                def symbol(body: Value, message: Message) -> bool:
                    found = other(body, message)
                    return (type(found) is Symbol
                            and (found is fixed or str.__eq__(found, fixed))) is equal
                return symbol
            return lambda body, message: _same(other(body, message), fixed) is equal
    if name in _ORDER and len(args) == 2:
        left_value, right_value = _fast_value(args[0]), _fast_value(args[1])
        order = _ORDER[name]
        apply = LIBRARY[name].apply
        assert apply is not None

        def compare(body: Value, message: Message) -> bool:
            a, b = left_value(body, message), right_value(body, message)
            if type(a) is int and type(b) is int:
                return order(a, b)
            return apply([a, b]) is TRUE
        return compare
    whole = _fast_value(expr)
    return lambda body, message: _bool(whole(body, message)) is TRUE


def _refused(rule: Rule, detail: str | None) -> ConstraintError:
    check = canonical_value(rule.check)
    if len(check) > 120:
        check = check[:117] + "..."
    text = f"constraint {rule.name}: {rule.message} ({detail or 'check: ' + check})"
    return ConstraintError(text, rule=rule.name, refusal=rule.message)


def _short(value: Value) -> str:
    try:
        text = canonical_value(value)
    except (TypeError, ValueError):  # pragma: no cover - evaluated values print
        text = repr(value)
    return text if len(text) <= 40 else text[:37] + "..."


def _member_at(value: Value | None, key: str, keyword: object = None) -> Any:
    """The member of ``value`` at the keyword ``key`` (looked up among the ``:key value``
    pairs after a list's heads; ``keyword``, where given, is that key's Keyword object,
    compared by identity before the text), or ``_MISSING``."""
    if type(value) is not tuple:
        return _MISSING
    i, count = 0, len(value)
    while i < count and type(value[i]) is not Keyword:
        i += 1  # the heads
    while i + 1 < count and type(value[i]) is Keyword:
        if value[i] is keyword or str.__str__(value[i]) == key:
            return value[i + 1]
        i += 2
    return _MISSING


def _member(value: Value | None, path: tuple[str, ...]) -> Any:
    """The member of ``value`` at the keyword ``path`` (each key looked up as
    :func:`_member_at` does), or ``_MISSING``."""
    for key in path:
        value = _member_at(value, key)
        if value is _MISSING:
            return _MISSING
    return value


def _path_of(args: tuple[Value, ...]) -> tuple[str, ...]:
    if not args or any(type(a) is not Keyword for a in args):
        raise ValueError("field and has take one or more keywords (:key :inner …)")
    return tuple(str.__str__(a) for a in args)


def _envelope_name(args: tuple[Value, ...]) -> str:
    if len(args) != 1 or type(args[0]) is not Symbol or str(args[0]) not in ENVELOPE_FIELDS:
        raise ValueError("envelope takes one field name: " + " ".join(ENVELOPE_FIELDS))
    return str(args[0])


def _no_args(args: tuple[Value, ...]) -> None:
    if args:
        raise ValueError("head takes no arguments")


def _quoted(args: tuple[Value, ...]) -> Value:
    """``(quote ATOM)``: the atom itself, a symbol included."""
    if len(args) != 1 or type(args[0]) is tuple:
        raise ValueError("quote takes one atom")
    return args[0]


def _intent_of(value: Value) -> Intent:
    try:
        if type(value) is Symbol:
            return Intent(str(value))
    except ValueError:
        pass
    raise ValueError(f"{_short(value)} is not an intent")


def _show_path(path: tuple[str, ...]) -> str:
    return "".join(f"[:{key}]" for key in path)


class _MessageContext:
    """The context forms over one message and, where a conversation is tracked, its
    thread's snapshots (``history``; ``None`` for a stateless check)."""

    __slots__ = ("history", "message")

    def __init__(self, message: Message, history: dict[Intent, Snapshot] | None) -> None:
        self.message = message
        self.history = history

    def lookup(self, form: str, args: tuple[Value, ...]) -> Value:
        if form in ("field", "has"):
            path = _path_of(args)
            found = _member(self.message.body, path)
            if form == "has":
                return FALSE if found is _MISSING else TRUE
            if found is _MISSING:
                raise Absent(f"the body has no {_show_path(path)}")
            return found  # type: ignore[no-any-return]
        if form in ("envelope", "has-envelope"):
            name = _envelope_name(args)
            value = getattr(self.message, ENVELOPE_FIELDS[name])
            if form == "has-envelope":
                return FALSE if value is None else TRUE
            if value is None:
                raise Absent(f"the envelope has no {name}")
            return value  # type: ignore[no-any-return]
        if form == "head":
            _no_args(args)
            body = self.message.body
            if type(body) is not tuple or not body:
                raise Absent("the body is not a list with a head")
            return body[0]
        if form == "quote":
            return _quoted(args)
        if form == "seen":
            if len(args) != 1:
                raise ValueError("seen takes one intent")
            intent = _intent_of(args[0])
            return TRUE if self.history is not None and intent in self.history else FALSE
        raise ValueError(f"unknown form {form}")

    def earlier(self, intent: Value) -> Context:
        wanted = _intent_of(intent)
        snapshot = None if self.history is None else self.history.get(wanted)
        if snapshot is None:
            raise Absent(f"no earlier {wanted.value} message in this conversation")
        return _SnapshotContext(snapshot, wanted)


class _SnapshotContext:
    """The context forms over an earlier message, as its :class:`Snapshot` holds it."""

    __slots__ = ("intent", "snapshot")

    def __init__(self, snapshot: Snapshot, intent: Intent) -> None:
        self.snapshot = snapshot
        self.intent = intent

    def lookup(self, form: str, args: tuple[Value, ...]) -> Value:
        if form in ("field", "has"):
            read: Read = ("field", _path_of(args))
            where = f"the earlier {self.intent.value}'s body has no {_show_path(read[1])}"
        elif form in ("envelope", "has-envelope"):
            read = ("envelope", (_envelope_name(args),))
            where = f"the earlier {self.intent.value} has no {read[1][0]}"
        elif form == "head":
            _no_args(args)
            read = ("head", ())
            where = f"the earlier {self.intent.value}'s body is not a list with a head"
        elif form == "quote":
            return _quoted(args)
        else:
            raise ValueError(f"{form} is not allowed inside earlier")
        value = self.snapshot.values.get(read)
        if form.startswith("has"):
            return FALSE if value is None else TRUE
        if value is None:
            raise Absent(where)
        return value

    def earlier(self, intent: Value) -> Context:
        raise ValueError("earlier is not allowed inside earlier")


def constraints_not_carried(section: Value | None) -> tuple[str, ...]:
    """The lines an export (grammar or JSON Schema) writes for a ``(constraints …)``
    section it cannot carry: one per rule, its name and message (none without one)."""
    if type(section) is not tuple:
        return ()
    # (canonical text: a message's newlines and quotes come escaped, never raw)
    return tuple(f"constraint {_short(rule[1])}: {canonical_value(rule[4][1])}"
                 for rule in section[1:]
                 if type(rule) is tuple and len(rule) == 5 and type(rule[4]) is tuple
                 and len(rule[4]) == 2)


_RELATIONS = {"<": "is less than", "<=": "is at most", ">": "is more than",
              ">=": "is at least", "=": "equals", "!=": "differs from"}
_ARITHMETIC = {"+": " + ", "-": " - ", "*": " × ", "/": " ÷ "}
#: The longest statement of a check in words (a longer one is cut with "…").
MAX_WORDS_CHARS = 400


def in_words(check: Value) -> str:
    """A loaded rule's check stated in words: ``(<= (field :bid :price) (earlier CFP
    (field :budget)))`` is "`:bid :price` is at most the earlier CFP's `:budget`". Its depth
    is bounded at load (:data:`MAX_RULE_DEPTH`), so the recursion is too."""
    text = _words(check, "")
    return text if len(text) <= MAX_WORDS_CHARS else text[:MAX_WORDS_CHARS - 1] + "…"


def _words(expr: Value, whose: str) -> str:
    if type(expr) is not tuple:
        return canonical_value(expr)
    if not expr or type(expr[0]) is not Symbol:  # pragma: no cover - refused at load
        return canonical_value(expr)
    head, args = str(expr[0]), expr[1:]
    path = " ".join(canonical_value(a) for a in args)
    if head == "field":
        return f"{whose}`{path}`"
    if head == "has":
        return f"{whose}`{path}` is present"
    if head == "head":
        return f"{whose or 'the '}body's head"
    if head == "envelope":
        return f"{whose}envelope {path}"
    if head == "has-envelope":
        return f"{whose}envelope has {path}"
    if head == "quote":
        return path
    if head == "seen":
        return f"an earlier {path} message was exchanged"
    if head == "earlier" and len(args) == 2:
        return _words(args[1], f"the earlier {canonical_value(args[0])}'s ")
    parts = [_words(a, whose) for a in args]
    if head in _RELATIONS:
        return f" {_RELATIONS[head]} ".join(parts)
    if head in _ARITHMETIC and len(parts) > 1:
        return "(" + _ARITHMETIC[head].join(parts) + ")"
    if head in ("and", "or"):
        return "(" + f" {head} ".join(parts) + ")"
    if head == "not":
        return f"not {parts[0]}"
    if head == "if" and len(parts) == 3:
        return f"(if {parts[0]} then {parts[1]}, otherwise {parts[2]})"
    if head in ("min", "max"):
        return f"the {'least' if head == 'min' else 'greatest'} of " + ", ".join(parts)
    return f"{head}(" + ", ".join(parts) + ")"  # (-x, seconds … hours)


# --------------------------------------------------------------------------- loading

def _bad(where: str, message: str) -> DescriptorError:
    return DescriptorError(f"descriptor: {where}: {message}")


def read_constraints(section: Value, *, intents: tuple[Intent, ...],
                     functions: Value | None, conversation: bool) -> Constraints:
    """Compile a ``(constraints …)`` section, checked statically (spec/conversations.md
    §5): ``intents`` are the descriptor's governed ones, ``functions`` its ``(functions
    …)`` section (``None``: no function may be called), ``conversation`` whether it
    declares a conversation (``earlier`` and ``seen`` need one). Raises
    :class:`DescriptorError` naming the rule and the path into the section."""
    if type(section) is not tuple or not section or section[0] != Symbol("constraints"):
        raise _bad("$.constraints", "expected a (constraints …) section")
    allowed = frozenset() if functions is None else read_functions(functions)
    if len(section) - 1 > MAX_RULES:
        raise _bad("$.constraints", f"{len(section) - 1} rules, more than the "
                   f"{MAX_RULES} a descriptor may have")
    rules: list[Rule] = []
    reads: dict[Intent, set[Read]] = {}
    for index, item in enumerate(section[1:], 1):
        where = f"$.constraints[{index}]"
        rule = _read_rule(item, where, intents, allowed, conversation, reads)
        if any(r.name == rule.name for r in rules):
            raise _bad(where, f"rule {rule.name} is defined twice")
        rules.append(rule)
    return Constraints(tuple(rules), allowed,
                       reads={k: frozenset(v) for k, v in reads.items()})


def _read_rule(item: Value, where: str, governed: tuple[Intent, ...],
               allowed: frozenset[str], conversation: bool,
               reads: dict[Intent, set[Read]]) -> Rule:
    if type(item) is not tuple or len(item) != 5 or item[0] != Symbol("rule") or \
            type(item[1]) is not Symbol:
        raise _bad(where, "expected (rule NAME (intents INTENT …) (check EXPR) "
                   "(message \"…\"))")
    name = str(item[1])
    where = f"{where} (rule {name})"
    parts = item[2:]
    heads = ("intents", "check", "message")
    for part, head in zip(parts, heads, strict=True):
        if type(part) is not tuple or not part or part[0] != Symbol(head):
            raise _bad(where, f"expected ({head} …) here, in the order "
                       "(intents …) (check …) (message …)")
    intents_part, check_part, message_part = cast("tuple[tuple[Value, ...], ...]", parts)
    intents: list[Intent] = []
    for value in intents_part[1:]:
        try:
            intent = _intent_of(value)
        except ValueError:
            raise _bad(where, f"(intents …) holds {_short(value)}, not an intent") from None
        if intent not in governed:
            raise _bad(where, f"(intents …) names {intent.value}, which the descriptor does "
                       "not govern")
        if intent in intents:
            raise _bad(where, f"(intents …) names {intent.value} twice")
        intents.append(intent)
    if not intents:
        raise _bad(where, "(intents …) must name at least one intent")
    if len(check_part) != 2:
        raise _bad(where, "(check …) holds exactly one expression")
    if len(message_part) != 2 or type(message_part[1]) is not str or not message_part[1]:
        raise _bad(where, "(message …) holds exactly one non-empty string")
    text = message_part[1]
    if len(text) > MAX_MESSAGE_CHARS:
        raise _bad(where, f"the message has {len(text)} characters, more than "
                   f"{MAX_MESSAGE_CHARS}")
    check = check_part[1]
    earlier = _check_expression(check, f"{where}.check", governed, allowed, conversation,
                                reads)
    return Rule(name, tuple(intents), check, text, earlier, _compile(check))


def _check_expression(expr: Value, where: str, governed: tuple[Intent, ...],
                      allowed: frozenset[str], conversation: bool,
                      reads: dict[Intent, set[Read]]) -> frozenset[Intent]:
    """Walk a check (iteratively), counting its nodes and calls nested; return the intents
    its earlier/seen forms name. Raises :class:`DescriptorError`."""
    nodes = 0
    earlier: set[Intent] = set()
    # (value, path, calls nested around it, the intent of the earlier it is inside)
    stack: list[tuple[Value, str, int, Intent | None]] = [(expr, "", 0, None)]
    while stack:
        node, path, depth, inside = stack.pop()
        nodes += 1
        if nodes > MAX_RULE_NODES:
            raise _bad(where, f"the check has more than {MAX_RULE_NODES} nodes")
        here = f"{where}{path}"
        if type(node) is not tuple:
            try:
                _atom(node)
            except (TypeError, ValueError) as exc:
                raise _bad(here, str(exc)) from None
            continue
        if not node or type(node[0]) is not Symbol:
            raise _bad(here, "a call starts with a function or form name")
        if depth + 1 > MAX_RULE_DEPTH:
            raise _bad(here, f"calls nested more than {MAX_RULE_DEPTH} deep")
        head = str(node[0])
        args = node[1:]
        nodes += 1 + (len(args) if head in CONTEXT_FORMS and head != "earlier" else 0) \
            + (head == "earlier")  # the name, and the forms' unevaluated arguments
        if nodes > MAX_RULE_NODES:
            raise _bad(where, f"the check has more than {MAX_RULE_NODES} nodes")
        if head in CONTEXT_FORMS:
            try:
                if head in ("field", "has"):
                    reading: Read = ("field", _path_of(args))
                elif head in ("envelope", "has-envelope"):
                    reading = ("envelope", (_envelope_name(args),))
                elif head == "head":
                    _no_args(args)
                    reading = ("head", ())
                elif head == "quote":
                    if type(_quoted(args)) is not Symbol:
                        _atom(args[0])  # (a number in range, a string …)
                    continue
                else:
                    if inside is not None:
                        raise ValueError(f"{head} is not allowed inside earlier")
                    if not conversation:
                        raise ValueError(f"{head} needs a (conversation …) section: "
                                         "earlier messages are a conversation's")
                    if len(args) != (2 if head == "earlier" else 1):
                        raise ValueError(f"{head} takes an intent" +
                                         (" and an expression" if head == "earlier" else ""))
                    intent = _intent_of(args[0])
                    if intent not in governed:
                        raise ValueError(f"{head} names {intent.value}, which the "
                                         "descriptor does not govern")
                    earlier.add(intent)
                    reads.setdefault(intent, set())
                    if head == "earlier":
                        stack.append((args[1], f"{path}[2]", depth + 1, intent))
                    continue
            except (TypeError, ValueError) as exc:
                raise _bad(here, str(exc)) from None
            if inside is not None:
                reads[inside].add(reading)
            continue
        fn = LIBRARY.get(head)
        if fn is None:
            raise _bad(here, f"unknown function {head}")
        if head == "now":
            raise _bad(here, "(now) is not allowed in a rule: a message's verdict may not "
                       "depend on the receiver's clock")
        if head not in allowed:
            raise _bad(here, f"function {head} is not listed in the descriptor's "
                       "(functions …)")
        if len(args) < fn.min_args or (fn.max_args is not None and len(args) > fn.max_args):
            raise _bad(here, f"{head} takes {fn.arity()} arguments, not {len(args)}")
        for i in range(len(args), 0, -1):
            stack.append((node[i], f"{path}[{i}]", depth + 1, inside))
    return frozenset(earlier)
