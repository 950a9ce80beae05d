"""Conversations: which message may come next (spec/conversations.md §1).

Theory of operation
-------------------
A protocol's ``(conversation …)`` section is a state machine *as data*: two roles, an
initial state, final states, and a table of transitions ``(STATE INTENT ROLE NEXT)``. The
table knows nothing of agents, messages or time; :func:`compile_machine` checks it once and
turns it into a :class:`Machine` (a frozen mapping). Two rules hold in every machine and are
not written in its table:

* Rule 1 — ``NOT-UNDERSTOOD`` is accepted in every state, from either party, at any time; it
  changes nothing but the conversation's history.
* Rule 2 — ``CANCEL`` from the initiator ends the conversation in the state ``cancelled``
  from any state that is not final, at any time (it is how a timed-out conversation ends);
  from anyone else, or after the end, it is refused. Neither can start a conversation.

A :class:`Conversation` is one thread between two agents, the initiator (who sent its first
message) and its peer. It binds each agent to a role, remembers the message ids it has seen,
and the reply-by deadline of the last message that set one. ``receive(message, now=…)``
either accepts a message, returning a :class:`Step`, or raises :class:`ConversationError`
naming the message and the state — and then nothing about the conversation has changed:
every check runs before the first assignment.

A :class:`ConversationTracker` holds the threads of many conversations, keyed by
conversation id and peer: a manager's call for proposals sent to seven contractors under
one conversation id is seven threads, each with its own state. Nothing here reads a clock
or a socket: time is the ``now`` argument, in Unix milliseconds.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from types import MappingProxyType
from typing import TYPE_CHECKING, cast

from ..core._canonical import canonical_value
from ..core._errors import ConversationError, DescriptorError, LimitError
from ..core._values import INT64_MAX, INT64_MIN, URI, Symbol, Value
from ._constraints import Constraints, Snapshot, read_constraints
from ._message import Intent, Message

if TYPE_CHECKING:
    from ._descriptor import ProtocolDescriptor

CANCELLED = Symbol("cancelled")
_SPECIAL = (Intent.NOT_UNDERSTOOD, Intent.CANCEL)
_PARTS = ("roles", "initial", "final", "transitions")


@dataclass(frozen=True, slots=True)
class Machine:
    """A conversation state machine, as declared. ``roles[0]`` is the initiator's role.
    ``transitions`` maps ``(state, intent, role)`` to the next state; ``states`` lists every
    state in first-mention order, ``cancelled`` last."""

    roles: tuple[Symbol, Symbol]
    initial: Symbol
    final: frozenset[Symbol]
    transitions: Mapping[tuple[Symbol, Intent, Symbol], Symbol]
    states: tuple[Symbol, ...]

    @property
    def initiator(self) -> Symbol:
        return self.roles[0]

    def is_final(self, state: Symbol) -> bool:
        return state in self.final or state == CANCELLED

    def allowed(self, state: Symbol) -> list[tuple[Intent, Symbol]]:
        """The (intent, role) pairs the table allows in ``state``, in table order, plus
        CANCEL by the initiator where rule 2 allows it (NOT-UNDERSTOOD is always allowed
        and not listed)."""
        found = [(intent, role) for (s, intent, role) in self.transitions if s == state]
        if not self.is_final(state):
            found.append((Intent.CANCEL, self.initiator))
        return found

    def next_state(self, state: Symbol, intent: Intent, role: Symbol) -> Symbol | None:
        """Where ``intent`` sent by ``role`` leads from ``state``, or ``None`` if it is not
        allowed (rule 1: NOT-UNDERSTOOD leads back to ``state``)."""
        if intent is Intent.NOT_UNDERSTOOD:
            return state
        if intent is Intent.CANCEL:
            return CANCELLED if role == self.initiator and not self.is_final(state) else None
        return self.transitions.get((state, intent, role))


def machine_table(machine: Machine, intents: Sequence[Intent]) -> tuple[int, ...]:
    """``machine``'s transitions as integers, for a native twin: at ``(state * len(intents)
    + intent) * 2 + role`` the index in ``machine.states`` of the next state, or -1 (none),
    with states, intents and roles by their index in ``machine.states``, ``intents`` and
    ``machine.roles``. Rules 1 and 2 are not in it (they are the same in every machine)."""
    index = {state: n for n, state in enumerate(machine.states)}
    table = [-1] * (len(machine.states) * len(intents) * 2)
    where = {intent: n for n, intent in enumerate(intents)}
    for (state, intent, role), target in machine.transitions.items():
        table[(index[state] * len(intents) + where[intent]) * 2
              + machine.roles.index(role)] = index[target]
    return tuple(table)


def _show(value: Value) -> str:
    text = canonical_value(value)
    return text if len(text) <= 40 else text[:37] + "..."


def _bad(message: str, path: str) -> DescriptorError:
    return DescriptorError(f"descriptor: (conversation …) at {path}: {message}")


def _symbols(part: tuple[Value, ...], path: str, what: str) -> list[Symbol]:
    for i, item in enumerate(part[1:], 1):
        if type(item) is not Symbol:
            raise _bad(f"{what} are symbols, found {_show(item)}", f"{path}[{i}]")
    return cast("list[Symbol]", list(part[1:]))  # (each checked just above)


def compile_machine(section: Value, *, intents: Iterable[Intent] | None = None) -> Machine:
    """Check a ``(conversation (roles A B) (initial S) (final S …) (transitions (S INTENT
    ROLE S) …))`` section and return its :class:`Machine`.

    ``intents``: the intents the descriptor governs; every transition's intent must be one
    of them (a message with another intent could never pass pass 2). Raises
    :class:`DescriptorError` with the path of the problem in the section.
    """
    if type(section) is not tuple or not section or section[0] != Symbol("conversation"):
        raise _bad("expected a (conversation …) section", "$")
    parts: dict[str, tuple[Value, ...]] = {}
    paths: dict[str, str] = {}
    for i, part in enumerate(section[1:], 1):
        path = f"$.conversation[{i}]"
        if type(part) is not tuple or not part or type(part[0]) is not Symbol \
                or str(part[0]) not in _PARTS:
            raise _bad("expected (roles …), (initial …), (final …) or (transitions …), found "
                       + _show(part), path)
        name = str(part[0])
        if name in parts:
            raise _bad(f"({name} …) is repeated", path)
        if parts and _PARTS.index(name) < _PARTS.index(list(parts)[-1]):
            raise _bad(f"({name} …) is out of order: the order is " + " ".join(_PARTS), path)
        parts[name] = part
        paths[name] = path
    for name in _PARTS:
        if name not in parts:
            raise _bad(f"missing ({name} …)", "$.conversation")

    roles = _symbols(parts["roles"], paths["roles"], "roles")
    if len(roles) != 2 or roles[0] == roles[1]:
        raise _bad("(roles …) names exactly two distinct roles, the initiator's first",
                   paths["roles"])
    initial = _symbols(parts["initial"], paths["initial"], "states")
    if len(initial) != 1:
        raise _bad("(initial …) names exactly one state", paths["initial"])
    final = _symbols(parts["final"], paths["final"], "states")
    if not final or len(set(final)) != len(final):
        raise _bad("(final …) names one or more distinct states", paths["final"])
    start = initial[0]
    if start in final:
        raise _bad(f"the initial state {start} is final", paths["initial"])
    states: list[Symbol] = [start, *final]
    governed = None if intents is None else frozenset(intents)
    table: dict[tuple[Symbol, Intent, Symbol], Symbol] = {}
    for i, row in enumerate(parts["transitions"][1:], 1):
        at = f"{paths['transitions']}[{i}]"
        if type(row) is not tuple or len(row) != 4 or any(type(x) is not Symbol for x in row):
            raise _bad("a transition is (STATE INTENT ROLE NEXT-STATE), four symbols", at)
        # (checked just above: four symbols)
        state, intent_name, role, target = cast("tuple[Symbol, Symbol, Symbol, Symbol]", row)
        try:
            intent = Intent(str(intent_name))
        except ValueError:
            raise _bad(f"{intent_name} is not an intent", f"{at}[1]") from None
        if intent in _SPECIAL:
            raise _bad(f"{intent.value} needs no transition: it is allowed by rule "
                       f"{1 if intent is Intent.NOT_UNDERSTOOD else 2}", f"{at}[1]")
        if governed is not None and intent not in governed:
            raise _bad(f"{intent.value} is not among the descriptor's (intents …)", f"{at}[1]")
        if role not in roles:
            raise _bad(f"{role} is not a role (roles: {roles[0]} {roles[1]})", f"{at}[2]")
        for s, where in ((state, 0), (target, 3)):
            if s == CANCELLED:
                raise _bad("the state cancelled is reserved for rule 2", f"{at}[{where}]")
        if state in final:
            raise _bad(f"{state} is final: no transition leaves it", at)
        key = (state, intent, role)
        if key in table:
            raise _bad(f"a second transition for {state} {intent.value} {role}", at)
        table[key] = target
        for s in (state, target):
            if s not in states:
                states.append(s)
    if not table:
        raise _bad("(transitions …) lists no transition", paths["transitions"])
    # Every state is reachable from the initial one, and every state that is not final has
    # a way on: a machine never strands a conversation by construction.
    reached = {start}
    frontier = [start]
    while frontier:
        here = frontier.pop()
        for (s, _, _), target in table.items():
            if s == here and target not in reached:
                reached.add(target)
                frontier.append(target)
    for s in states:
        if s not in reached:
            raise _bad(f"state {s} cannot be reached from {start}", "$.conversation")
        if s not in final and not any(k[0] == s for k in table):
            raise _bad(f"state {s} is not final and no transition leaves it",
                       "$.conversation")
    return Machine((roles[0], roles[1]), start, frozenset(final),
                   MappingProxyType(table), (*states, CANCELLED))


# --------------------------------------------------------------------------- conversations

@dataclass(frozen=True, slots=True)
class Step:
    """One accepted message: who sent it in which role, the states before and after, and
    whether ``after`` is final (the conversation is over)."""

    message_id: str
    intent: Intent
    role: Symbol
    sender: URI
    before: Symbol
    after: Symbol
    finished: bool = False


#: One open thread of a session's tracker (ConversationTracker._pair_threads).
PairThread = tuple[str, bool, int, dict[str, int], int | None, int, list[Step]]


def _check_now(now: object) -> int:
    if type(now) is not int or not INT64_MIN <= now <= INT64_MAX:
        raise TypeError("now must be an int of Unix milliseconds")
    return now


def _describe(message: Message) -> str:
    return f'message "{message.message_id}" ({message.intent.value} from {message.sender})'


class _Where:
    """``message "ID" (INTENT from SENDER) refused``, written out only when formatted."""

    __slots__ = ("message",)

    def __init__(self, message: Message) -> None:
        self.message = message

    def __format__(self, spec: str) -> str:
        return f"{_describe(self.message)} refused"


class Conversation:
    """One conversation thread between an initiator and a peer, following a
    :class:`Machine`. Create it with the first message (:meth:`start`) or empty and feed
    every message, in order, to :meth:`receive`."""

    def __init__(self, machine: Machine, *, protocol: Symbol | str,
                 conversation_id: str, constraints: Constraints | None = None) -> None:
        if not isinstance(machine, Machine):
            raise TypeError("machine must be a Machine (see compile_machine)")
        self.machine = machine
        #: The protocol's rules: those with (earlier …)/(seen …) are applied here.
        self.constraints = constraints
        #: Per intent an (earlier …) names, what the rules read of its latest message.
        self._earlier: dict[Intent, Snapshot] = {}
        self.protocol = Symbol(str(protocol))
        self.conversation_id = conversation_id
        self._state = machine.initial
        #: role -> agent, bound by the first message.
        self._agents: dict[Symbol, URI] = {}
        self._seen: dict[str, Symbol] = {}  # message id -> the role that sent it
        self._deadline: tuple[int, Symbol] | None = None  # (reply-by, role that must reply)
        self._history: list[Step] = []

    @property
    def state(self) -> Symbol:
        return self._state

    @property
    def finished(self) -> bool:
        return self.machine.is_final(self._state)

    @property
    def agents(self) -> Mapping[Symbol, URI]:
        """The agent bound to each role (empty before the first message)."""
        return MappingProxyType(dict(self._agents))

    @property
    def deadline(self) -> int | None:
        """The reply-by time (Unix ms) by which the awaited party must reply, or ``None``."""
        return None if self._deadline is None else self._deadline[0]

    @property
    def history(self) -> tuple[Step, ...]:
        return tuple(self._history)

    def timed_out(self, *, now: int) -> bool:
        """Whether a pending reply-by deadline has passed at ``now`` (the timeout path:
        the awaited party's replies are refused from now on)."""
        return self._deadline is not None and _check_now(now) > self._deadline[0]

    def _refuse(self, message: Message, reason: str) -> ConversationError:
        return ConversationError(
            f"{_describe(message)} refused in state {self._state} of conversation "
            f'"{self.conversation_id}": {reason}', path="$")

    def check(self, message: Message, *, now: int) -> Step:
        """What :meth:`receive` would do, without doing it: the :class:`Step`, or
        :class:`ConversationError`."""
        _check_now(now)
        if not isinstance(message, Message):
            raise TypeError("message must be a cbcl.Message")
        machine = self.machine
        # (``a is not b and a != b``: the same object, as it mostly is, needs no compare)
        if message.protocol is not self.protocol and message.protocol != self.protocol:
            raise self._refuse(message, f"it speaks {message.protocol}, the conversation "
                                        f"speaks {self.protocol}")
        if message.conversation_id != self.conversation_id:
            raise self._refuse(message, "its conversation-id is "
                                        f"{message.conversation_id!r}")
        sender, receiver = message.sender, message.receiver
        if sender is receiver or sender == receiver:
            raise self._refuse(message, "its sender is its receiver")
        initiator, peer = machine.roles
        agents = self._agents
        if not agents:
            if message.intent in _SPECIAL:
                raise self._refuse(message, "a conversation cannot start with "
                                            f"{message.intent.value}")
            role = initiator
        else:
            first, second = agents[initiator], agents[peer]
            if (sender is first or sender == first) \
                    and (receiver is second or receiver == second):
                role = initiator
            elif (sender is second or sender == second) \
                    and (receiver is first or receiver == first):
                role = peer
            else:
                raise self._refuse(message, "it is not between "
                                            f"{self._agents[initiator]} ({initiator}) and "
                                            f"{self._agents[peer]} ({peer})")
        if message.message_id in self._seen:
            raise self._refuse(message, "its message-id was seen before in this conversation")
        if message.in_reply_to is not None:
            replied = self._seen.get(message.in_reply_to)
            if replied is None:
                raise self._refuse(message, f'it replies to "{message.in_reply_to}", which is '
                                            "not a message of this conversation")
            if replied == role:
                raise self._refuse(message, f'it replies to "{message.in_reply_to}", which '
                                            "its own side sent")
        target = machine.next_state(self._state, message.intent, role)
        if target is None:
            if machine.is_final(self._state):
                reason = "the conversation has ended"
            else:
                allowed = ", ".join(f"{i.value} from the {r}"
                                    for i, r in machine.allowed(self._state))
                reason = f"{message.intent.value} from the {role} is not allowed here " \
                         f"(allowed: {allowed}; NOT-UNDERSTOOD at any point)"
            raise self._refuse(message, reason)
        if message.intent not in _SPECIAL and self._deadline is not None:
            deadline, awaited = self._deadline
            if role == awaited and now > deadline:
                raise self._refuse(message, f"timeout: the reply was due by {deadline} "
                                            f"(reply-by) and it is {now}")
        if self.constraints is not None:  # (ConstraintError, LimitError)
            self.constraints.check_in_conversation(message, self._earlier)
        return Step(message.message_id, message.intent, role, message.sender, self._state,
                    target, machine.is_final(target))

    def receive(self, message: Message, *, now: int) -> Step:
        """Accept ``message`` at time ``now`` (Unix ms) if the protocol allows it here, and
        advance. Raises :class:`ConversationError` naming the message and the state, and
        then leaves the conversation exactly as it was; ``TypeError`` for bad arguments."""
        step = self.check(message, now=now)
        # Every check has passed: only now does anything change.
        if not self._agents:
            self._agents = {self.machine.roles[0]: message.sender,
                            self.machine.roles[1]: message.receiver}
        self._seen[message.message_id] = step.role
        if message.intent is not Intent.NOT_UNDERSTOOD:
            other = self.machine.roles[1] if step.role == self.machine.roles[0] \
                else self.machine.roles[0]
            if message.reply_by is not None and not self.machine.is_final(step.after):
                self._deadline = (message.reply_by, other)
            elif self._deadline is not None and self._deadline[1] == step.role:
                self._deadline = None  # the awaited party has replied
        self._state = step.after
        self._history.append(step)
        if self.constraints is not None:
            self.constraints.remember(message, self._earlier)
        return step


class ConversationTracker:
    """The conversations an agent takes part in, keyed by conversation id and peer.

    ``machines`` maps protocol ids to their :class:`Machine` (see :meth:`from_descriptors`).
    :meth:`receive` routes each message to its thread — starting one when a conversation's
    initiator first writes to a new peer — and raises :class:`ConversationError` without
    changing anything when the message is out of place. Sans-io: ``now`` is an argument.

    A long-lived agent bounds what it keeps: ``max_open`` conversations may be open at once
    (a message that would start one more raises :class:`LimitError`), and with
    ``forget_finished=True`` a conversation that reaches a final state is dropped — its id
    is remembered among the last ``max_open`` finished ones (or 1,024 without
    ``max_open``), so a late or replayed message of it is still refused.
    """

    def __init__(self, machines: Mapping[Symbol | str, Machine], *,
                 max_open: int | None = None, forget_finished: bool = False) -> None:
        self._machines = {Symbol(str(k)): v for k, v in machines.items()}
        #: Protocol id -> its constraints with (earlier …)/(seen …), for its threads.
        self._constraints: dict[Symbol, Constraints] = {}
        for machine in self._machines.values():
            if not isinstance(machine, Machine):
                raise TypeError("machines must map protocol ids to Machine objects")
        if max_open is not None and (type(max_open) is not int or max_open < 1):
            raise ValueError("max_open must be a positive int or None")
        self.max_open = max_open
        self.forget_finished = bool(forget_finished)
        self._initiators: dict[str, URI] = {}
        self._protocols: dict[str, Symbol] = {}
        self._threads: dict[tuple[str, URI], Conversation] = {}
        self._peers: dict[str, list[URI]] = {}  # conversation id -> the peers of its threads
        self._finished: OrderedDict[str, None] = OrderedDict()
        self._finished_memory = max_open or 1024

    @classmethod
    def from_descriptors(cls, descriptors: Iterable[object], *, max_open: int | None = None,
                         forget_finished: bool = False) -> ConversationTracker:
        """A tracker for every descriptor (or loaded :class:`Protocol`) that declares a
        conversation (the options as for the constructor). Raises
        :class:`DescriptorError` for a malformed section."""
        machines: dict[Symbol | str, Machine] = {}
        constraints: dict[Symbol, Constraints] = {}
        for item in descriptors:
            descriptor = getattr(item, "descriptor", item)
            section = getattr(descriptor, "conversation", None)
            if section is not None:  # (only a descriptor has a conversation section)
                found = cast("ProtocolDescriptor", descriptor)
                machines[found.id] = compile_machine(section, intents=found.intents)
                rules = getattr(item, "constraints", None)  # (a loaded Protocol's)
                if found.constraints is not None and rules is None:
                    rules = read_constraints(found.constraints, intents=found.intents,
                                             functions=found.functions, conversation=True)
                if rules is not None and rules.stateful:
                    constraints[found.id] = rules
        tracker = cls(machines, max_open=max_open, forget_finished=forget_finished)
        tracker._constraints = constraints
        return tracker

    def get(self, conversation_id: str, peer: URI | str) -> Conversation | None:
        """The thread of ``conversation_id`` with ``peer``, or ``None``."""
        return self._threads.get((conversation_id, URI(str(peer))))

    def conversations(self) -> tuple[Conversation, ...]:
        return tuple(self._threads.values())

    def _route(self, message: Message) -> tuple[Conversation, bool]:
        cid = message.conversation_id
        where = _Where(message)  # (written out only for a refusal)
        if cid is None:
            raise ConversationError(f"{where}: it has no conversation-id", path="$")
        machine = self._machines.get(message.protocol)
        if machine is None:
            raise ConversationError(f"{where}: protocol {message.protocol} declares no "
                                    "conversation", path="$")
        initiator = self._initiators.get(cid)
        if initiator is None:
            if cid in self._finished:
                raise ConversationError(f'{where}: conversation "{cid}" has finished',
                                        path="$")
            self._check_room(where)
            return Conversation(machine, protocol=message.protocol, conversation_id=cid,
                                constraints=self._constraints.get(message.protocol)), True
        if message.protocol != self._protocols[cid]:
            raise ConversationError(f'{where}: conversation "{cid}" speaks '
                                    f"{self._protocols[cid]}", path="$")
        if message.sender == initiator:
            peer = message.receiver
        elif message.receiver == initiator:
            peer = message.sender
        else:
            raise ConversationError(f'{where}: conversation "{cid}" was started by '
                                    f"{initiator}, who neither sends nor receives it",
                                    path="$")
        thread = self._threads.get((cid, peer))
        if thread is not None:
            return thread, False
        if message.sender != initiator:
            raise ConversationError(f'{where}: {peer} has no part in conversation "{cid}"; '
                                    f"only its initiator {initiator} can bring in a peer",
                                    path="$")
        self._check_room(where)
        return Conversation(machine, protocol=message.protocol, conversation_id=cid,
                            constraints=self._constraints.get(message.protocol)), True

    def _check_room(self, where: _Where) -> None:
        if self.max_open is not None and len(self._threads) >= self.max_open:
            raise LimitError(f"{where}: {self.max_open} conversations are open already",
                             limit="max_conversations", maximum=self.max_open)

    def check(self, message: Message, *, now: int) -> Step:
        """What :meth:`receive` would do, without doing it."""
        thread, _ = self._route(message)
        return thread.check(message, now=now)

    def receive(self, message: Message, *, now: int) -> Step:
        """Accept ``message`` in its conversation at ``now`` (Unix ms), or raise
        :class:`ConversationError` and change nothing."""
        _check_now(now)
        thread, new = self._route(message)
        step = thread.receive(message, now=now)
        cid = message.conversation_id
        if cid is None:  # pragma: no cover - _route refused it
            raise ConversationError("a message without a conversation-id", path="$")
        if new:
            self._initiators.setdefault(cid, message.sender)
            self._protocols.setdefault(cid, message.protocol)
            self._threads[(cid, message.receiver)] = thread
            self._peers.setdefault(cid, []).append(message.receiver)
        if step.finished and self.forget_finished:
            self._forget(cid)
        return step

    def _pair_threads(self, me: URI, peer: URI) -> list[PairThread]:
        """The open threads of a tracker of one protocol between ``me`` and ``peer`` only
        (a session's), in the form of cbcl._native.SessionState.threads(): (conversation
        id, started by ``peer``, state index, {message id: role index}, reply-by or
        ``None``, the awaited role index, history)."""
        threads: list[PairThread] = []
        for (cid, _), thread in self._threads.items():
            machine = thread.machine
            roles = machine.roles
            deadline = thread._deadline
            threads.append((cid, self._initiators[cid] == peer,
                            machine.states.index(thread._state),
                            {mid: roles.index(role) for mid, role in thread._seen.items()},
                            None if deadline is None else deadline[0],
                            0 if deadline is None else roles.index(deadline[1]),
                            list(thread._history)))
        return threads

    def _load_pair(self, me: URI, peer: URI, protocol: Symbol, threads: list[PairThread],
                   finished: list[str]) -> None:
        """Replace this tracker's conversations (one protocol's, between ``me`` and
        ``peer``) by ``threads`` (the form of :meth:`_pair_threads`) and its finished ids
        by ``finished``, oldest first."""
        machine = self._machines[protocol]
        roles = machine.roles
        self._initiators, self._protocols, self._threads, self._peers = {}, {}, {}, {}
        for cid, by_peer, state, seen, deadline, awaited, history in threads:
            first, second = (peer, me) if by_peer else (me, peer)
            thread = Conversation(machine, protocol=protocol, conversation_id=cid,
                                  constraints=self._constraints.get(protocol))
            thread._agents = {roles[0]: first, roles[1]: second}
            thread._seen = {mid: roles[role] for mid, role in seen.items()}
            thread._deadline = None if deadline is None else (deadline, roles[awaited])
            thread._state = machine.states[state]
            thread._history = list(history)
            self._initiators[cid] = first
            self._protocols[cid] = protocol
            self._threads[(cid, second)] = thread
            self._peers[cid] = [second]
        self._finished = OrderedDict.fromkeys(finished)

    def _forget(self, cid: str) -> None:
        """Drop a finished conversation's threads, keep its id among the finished ones."""
        peers = self._peers.get(cid, [])
        for peer in list(peers):  # (only this conversation's threads, not every one)
            if self._threads[(cid, peer)].finished:
                del self._threads[(cid, peer)]
                peers.remove(peer)
        if not peers:
            self._peers.pop(cid, None)
            self._initiators.pop(cid, None)
            self._protocols.pop(cid, None)
            self._finished[cid] = None
            while len(self._finished) > self._finished_memory:
                self._finished.popitem(last=False)
