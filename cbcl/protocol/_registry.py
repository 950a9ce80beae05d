"""The registry: descriptors verified, compiled under a guard, cached and held.

Theory of operation
-------------------
:meth:`Registry.load` verifies a descriptor against the trust store, checks its version
against the state store (rollback and freeze), compiles its grammar (in a guarded worker
unless told otherwise) and installs the :class:`~cbcl.protocol._protocol.Protocol`. Compiled
grammars are cached three ways: in this process (:class:`GrammarCache`, an LRU bounded
in bytes and keyed by the grammar and the versions that shape the tables), on disk
(:mod:`._cache`), and as refusals (a negative cache, so a peer cannot make us re-analyse
a grammar we already refused).
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import threading
import time
from collections import OrderedDict
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

import lark

from ..core._cache import DiskCache, default_cache_dir
from ..core._errors import CBCLError, GrammarError, LimitError, TrustError
from ..core._limits import DEFAULT_LIMITS, Limits
from ..core._reader import (
    read,
)
from ..core._values import Symbol
from ..core._version import __version__
from ..grammar._compile import (
    DEFAULT_MAX_TABLE_BYTES,
    DEFAULT_MEMORY,
    DEFAULT_TIMEOUT,
    FORMAT_VERSION,
    CompiledGrammar,
    TablesTooLarge,
    compile_grammar,
    compile_guarded,
    compiled_size as _compiled_grammar_size,
    from_data,
    to_data,
)
from ..grammar._lalr import table_bytes
from ..grammar._lr import LALR1
from ..grammar._subset import GrammarLimits, check_starts
from ._compat import (
    COMPATIBLE,
    UNCOMPILED,
    CompatLimits,
    CompatVerdict,
    compare,
    compare_guarded,
)
from ._descriptor import ProtocolDescriptor, digest_of, read_descriptor
from ._protocol import Protocol
from ._state import StateRecord, StateStore
from ._trust import DESCRIPTOR_FAILED as _FAILED, TrustStore, VerifiedDescriptor

if TYPE_CHECKING:
    from ._compat import CompatLimits


def _cache_key(grammar: str, limits: GrammarLimits, starts: tuple[str, ...]) -> str:
    fingerprint = hashlib.sha256(grammar.encode("utf-8")).hexdigest()
    return (f"cbcl-grammar/{FORMAT_VERSION} cbcl={__version__} lark={lark.__version__} "
            f"limits={limits} starts={','.join(starts)} grammar=sha256:{fingerprint}")


class _LRU:
    """A least-recently-used map bounded by the summed ``cost`` of its values (bytes, or 1
    per entry), safe to use from several threads."""

    def __init__(self, capacity: int, cost: Callable[[Any], int] = lambda value: 1) -> None:
        self.capacity = capacity
        self.cost = cost
        self.used = 0
        self._items: OrderedDict[str, tuple[Any, int]] = OrderedDict()
        self._lock = threading.Lock()

    def __len__(self) -> int:
        return len(self._items)

    def remember(self, key: str, value: Any, size: int | None = None) -> None:
        """Keep ``value`` under ``key``; ``size``, when the caller knows it, saves
        computing its cost again."""
        size = self.cost(value) if size is None else size
        with self._lock:
            old = self._items.pop(key, None)
            if old is not None:
                self.used -= old[1]
            if size > self.capacity:
                return  # never cached: it would evict everything and still not fit
            self._items[key] = (value, size)
            self.used += size
            while self.used > self.capacity:
                _, (_, freed) = self._items.popitem(last=False)
                self.used -= freed

    def recall(self, key: str) -> Any:
        item = self.recall_sized(key)
        return None if item is None else item[0]

    def recall_sized(self, key: str) -> tuple[Any, int] | None:
        """The value under ``key`` and its cost, or ``None``; marks it recently used."""
        with self._lock:
            item = self._items.get(key)
            if item is None:
                return None
            self._items.move_to_end(key)
            return item

    def clear(self) -> None:
        with self._lock:
            self._items.clear()
            self.used = 0


def _peer(text: str, limit: int = 120) -> str:
    """Text from a peer's descriptor, for a log line: clipped, then quoted with every
    character a terminal would not show as itself escaped (``repr``)."""
    return repr(text if len(text) <= limit else text[:limit - 3] + "...")


def _system_clock_ms() -> int:
    return time.time_ns() // 1_000_000


def compiled_size(compiled: CompiledGrammar | Protocol) -> int:
    """An estimate, in bytes, of what ``compiled`` (or a loaded protocol's tables) occupies
    in memory once loaded: :func:`cbcl.grammar._compile.compiled_size`, the measure the
    compile worker bounds; a protocol adds its grammar text and atoms."""
    if not isinstance(compiled, Protocol):
        return _compiled_grammar_size(compiled)
    size = 1024 + len(compiled.report) + 100 * len(compiled.atoms) \
        + len(compiled.descriptor.grammar)
    tables = compiled.tables
    if tables is not None:
        size += table_bytes(len(tables.actions), sum(map(len, tables.actions)),
                            len(tables.rules))
    return size


#: Bytes (by :func:`compiled_size`) of compiled grammars kept in memory, for every registry
#: of the process together; the least recently used are dropped first.
COMPILED_CACHE_BYTES = 64 << 20
#: The default of ``Registry(max_compiled_bytes=…)``: one compiled grammar larger than this
#: (by :func:`compiled_size`) is refused.
DEFAULT_MAX_COMPILED_BYTES = DEFAULT_MAX_TABLE_BYTES
#: Refused grammars remembered (each is a short error), so a peer cannot make us analyse a
#: grammar we refused again.
REFUSED_CACHE_ENTRIES = 1024

class GrammarCache:
    """What the registries that share it know of grammars, in memory: the compiled ones
    (the least recently used dropped past ``max_bytes``, by :func:`compiled_size`), the
    refused ones (``max_refused``, each a short error, so a peer cannot make us analyse a
    grammar we refused again), and the sizes of those found too large (each registry
    judges them by its own ``max_compiled_bytes``, so they are not verdicts). Compiled
    grammars are immutable, so one cache may serve every registry of a process: by default
    they share :data:`DEFAULT_GRAMMAR_CACHE`; give a registry its own to keep it apart.
    Thread-safe."""

    def __init__(self, *, max_bytes: int = COMPILED_CACHE_BYTES,
                 max_refused: int = REFUSED_CACHE_ENTRIES) -> None:
        for name, value in (("max_bytes", max_bytes), ("max_refused", max_refused)):
            if type(value) is not int or value < 1:
                raise ValueError(f"{name} must be a positive int")
        self.compiled = _LRU(max_bytes, compiled_size)
        self.refused = _LRU(max_refused)
        self.oversized = _LRU(max_refused)
        # Compatibility verdicts (spec/trust.md §6.1), by mode, both digests and the
        # limits: a function of those alone, so a refused update is refused again at once.
        self.verdicts = _LRU(max_refused)

    def clear(self) -> None:
        """Forget everything (as if in a new process; the disk cache stays)."""
        self.compiled.clear()
        self.refused.clear()
        self.oversized.clear()
        self.verdicts.clear()


#: The cache every registry shares unless given its own (``Registry(grammar_cache=…)``).
DEFAULT_GRAMMAR_CACHE = GrammarCache()


class CompileGate:
    """Bounds the grammar compiles of the registries that share it: at most ``workers``
    at once and ``queue`` more waiting; one more is refused at once. Thread-safe."""

    def __init__(self, workers: int, queue: int) -> None:
        if type(workers) is not int or workers < 1 or type(queue) is not int or queue < 0:
            raise ValueError("workers must be a positive int and queue a non-negative int")
        self.workers = workers
        self.queue = queue
        self._slots = threading.BoundedSemaphore(workers)
        self._lock = threading.Lock()
        self.admitted = 0  # compiling or waiting

    @contextlib.contextmanager
    def slot(self, wait: float) -> Iterator[None]:
        """Hold a compile slot. Raises :class:`LimitError` when ``workers + queue`` compiles
        are compiling or waiting already, or no slot frees within ``wait`` seconds."""
        with self._lock:
            if self.admitted >= self.workers + self.queue:
                raise LimitError(f"{self.admitted} grammars are compiling or waiting to",
                                 limit="compile_queue", maximum=self.workers + self.queue)
            self.admitted += 1
        try:
            if not self._slots.acquire(timeout=wait):
                raise LimitError(f"no compile slot within {wait:g} s", limit="compile_wait",
                                 maximum=round(wait))
            try:
                yield
            finally:
                self._slots.release()
        finally:
            with self._lock:
                self.admitted -= 1


@dataclass(frozen=True, slots=True)
class PreparedDescriptor:
    """A descriptor that passed every check of :meth:`Registry.prepare` — signatures,
    policy, key binding, expiry, rollback, equivocation, its grammar compiled, the
    compatibility the policy requires — and is neither registered nor recorded yet.
    ``signers``: the key ids that signed it (empty for an unsigned one); ``keys``: those
    keys' fingerprints; ``source``: where the compiled grammar came from (``compiled``,
    ``memory cache`` or ``disk cache``); ``payload``: the descriptor's exact bytes
    (recorded with it); ``checked``: the digests of the accepted
    descriptors it was found compatible with, as the policy requires (spec/trust.md
    §6.1), so :meth:`Registry.record` compares again only against a record that changed
    since."""

    descriptor: ProtocolDescriptor
    signers: tuple[str, ...]
    keys: tuple[str, ...]
    compiled: CompiledGrammar
    source: str = "compiled"
    payload: bytes = b""
    checked: frozenset[str] = frozenset()


class Registry:
    """The protocols an agent has loaded, by protocol id, and the trust that admits them.

    ``trust``: a :class:`TrustStore` or the path of a trust directory (spec/trust.md);
    without one only unsigned descriptors load, and only with ``allow_unsigned=True``.
    ``state_dir``: where the highest accepted version and digest of each protocol id
    persist, so rollback protection survives a restart (without it the registry still
    refuses rollback within its lifetime). ``clock``: a function returning the current Unix
    time in milliseconds, for ``expires`` (default: the system clock, read only here).

    ``cache_dir``: where compiled grammars persist (default ``$XDG_CACHE_HOME/cbcl``);
    ``None`` with ``disk_cache=False`` keeps them in memory only. ``grammar_limits`` bound
    descriptor grammars (draft §4); ``limits`` bound descriptor documents (draft §1.1).
    ``compile_timeout`` (seconds) and ``compile_memory`` (bytes) bound the worker process
    that compiles a grammar; ``isolate=False`` compiles in this process instead (for tools
    that run on trusted grammars only). ``max_compiled_bytes``: a compiled grammar whose
    tables would take more memory than this (estimated by :func:`compiled_size`) is refused
    (:class:`~cbcl.grammar._compile.TablesTooLarge`, a :class:`GrammarError`), by the
    analyser as it builds the automaton, in the worker or in this process, before any
    table is built; compiled (and refused) grammars are kept in ``grammar_cache``,
    a :class:`GrammarCache` (default :data:`DEFAULT_GRAMMAR_CACHE`, shared by every
    registry of the process, up to :data:`COMPILED_CACHE_BYTES`). ``compile_gate``: a
    :class:`CompileGate` shared by the registries of one server, held while a grammar
    compiles (a grammar found in a cache needs none); a compile it refuses, or that gets
    no slot within ``compile_wait`` seconds, raises :class:`LimitError`.

    ``compat_limits`` (a :class:`~cbcl.protocol._compat.CompatLimits`, default its defaults) bound
    the comparison a trust policy's ``(compatibility MODE)`` asks for (spec/trust.md §6.1):
    an update the comparison cannot prove compatible within them is refused.

    A registry may be read from several threads while one thread prepares a descriptor
    (:meth:`prepare`); :meth:`install` and :meth:`record` belong to one thread at a time.

    Raises :class:`TrustError` for a trust directory or state directory that cannot be
    used, ``TypeError`` for arguments of the wrong type.
    """

    def __init__(self, *, trust: TrustStore | str | os.PathLike[str] | None = None,
                 state_dir: str | os.PathLike[str] | None = None,
                 clock: Callable[[], int] | None = None,
                 cache_dir: str | os.PathLike[str] | None = None,
                 disk_cache: bool = True, grammar_limits: GrammarLimits | None = None,
                 limits: Limits | None = None, compile_timeout: float = DEFAULT_TIMEOUT,
                 compile_memory: int = DEFAULT_MEMORY, isolate: bool = True,
                 max_compiled_bytes: int = DEFAULT_MAX_COMPILED_BYTES,
                 compile_gate: CompileGate | None = None,
                 compile_wait: float = 60.0,
                 grammar_cache: GrammarCache | None = None,
                 compat_limits: CompatLimits | None = None) -> None:

        if type(max_compiled_bytes) is not int or max_compiled_bytes < 1:
            raise ValueError("max_compiled_bytes must be a positive int")
        if compat_limits is not None and not isinstance(compat_limits, CompatLimits):
            raise TypeError("compat_limits must be a cbcl.protocol._compat.CompatLimits")
        self.compat_limits = CompatLimits() if compat_limits is None else compat_limits
        if grammar_cache is not None and not isinstance(grammar_cache, GrammarCache):
            raise TypeError("grammar_cache must be a cbcl.descriptor.GrammarCache")
        self.grammar_cache = DEFAULT_GRAMMAR_CACHE if grammar_cache is None else grammar_cache
        self.max_compiled_bytes = max_compiled_bytes
        self.compile_gate = compile_gate
        self.compile_wait = compile_wait
        self.grammar_limits = GrammarLimits() if grammar_limits is None else grammar_limits
        self.limits = DEFAULT_LIMITS if limits is None else limits
        self.compile_timeout = compile_timeout
        self.compile_memory = compile_memory
        self.isolate = isolate
        self.disk = DiskCache(Path(cache_dir) if cache_dir else default_cache_dir()) \
            if disk_cache else None
        if trust is None or isinstance(trust, TrustStore):
            self.trust = trust
        elif isinstance(trust, (str, os.PathLike)):
            self.trust = TrustStore.from_directory(trust, limits=self.limits)
        else:
            raise TypeError("trust must be a cbcl.TrustStore or a directory path")
        # A record holds the accepted descriptor, which this registry read under
        # max_message_bytes: that bounds it.
        self.state = None if state_dir is None else StateStore(
            state_dir, max_descriptor_bytes=self.limits.max_message_bytes)
        if clock is not None and not callable(clock):
            raise TypeError("clock must be a function returning Unix time in milliseconds")
        self._clock = clock or _system_clock_ms
        self._protocols: dict[Symbol, Protocol] = {}
        # The loaded protocols the C fast paths may serve: those without constraints
        # (whose rules only the Python paths apply), so a protocol with them is never
        # accepted in C and one without costs nothing more.
        self._fast: dict[Symbol, Protocol] = {}
        self._constrained = False
        self._bindings: dict[str, tuple[str, ...]] = {}  # id -> keys, without a state dir
        self._abandoned = False
        #: The one-shot cbcl.decode's memos for this registry (cbcl.binary._codec._one_shot_memos:
        #: made at its first call, dropped with the registry).
        self._one_shot: Any = None

    def __contains__(self, protocol_id: object) -> bool:
        return self.get(protocol_id) is not None  # type: ignore[arg-type]

    def __len__(self) -> int:
        return len(self._protocols)

    def protocols(self) -> tuple[Protocol, ...]:
        """The loaded protocols, in load order."""
        return tuple(self._protocols.values())

    def _protocols_by_id(self) -> dict[Symbol, Protocol]:
        """The registry's own dict of the loaded protocols its fast paths serve, by id, not
        a copy: the same object for the registry's lifetime, changed in place as protocols
        are loaded, for cbcl's fast paths (the binary codec's frame state and encoder,
        parse's C tier), which look protocols up in it and never change it. A protocol
        with constraints is not in it (those paths decline its messages, and the Python
        paths, which apply the rules, decide them)."""
        return self._fast

    def _all_protocols_by_id(self) -> dict[Symbol, Protocol]:
        """The registry's own dict of every loaded protocol by id, those with constraints
        too (what :meth:`get` looks in), not a copy: the same object for the registry's
        lifetime, changed in place as protocols are loaded, for the binary encoder's
        unvalidated C path (which checks no rule, so constraints do not concern it); it
        never changes it."""
        return self._protocols

    def _register(self, protocol: Protocol) -> None:
        self._protocols[protocol.id] = protocol
        if protocol.constraints is None:
            self._fast[protocol.id] = protocol
        else:
            self._fast.pop(protocol.id, None)
        #: Whether some loaded protocol has constraints (then parse's Python path runs
        #: the C tiers with every protocol, and checks the rules after them).
        self._constrained = len(self._fast) < len(self._protocols)

    def get(self, protocol_id: str | Symbol) -> Protocol | None:
        """The loaded protocol with this id, or ``None``."""
        try:
            key = protocol_id if type(protocol_id) is Symbol else Symbol(str(protocol_id))
        except ValueError:
            return None
        return self._protocols.get(key)

    def load(self, payload: bytes, *, allow_unsigned: bool = False,
             now: int | None = None) -> Protocol:
        """Admit a descriptor, record it and register it under its id:
        :meth:`prepare`, then :meth:`record`, then :meth:`install`.

        ``payload`` is a ``(signed-descriptor …)`` document, verified against the trust
        store before its payload is read, or — only with ``allow_unsigned=True`` — a bare
        ``(protocol-descriptor …)``. Either way the descriptor must not have expired at
        ``now`` (Unix ms; default the registry's clock), must not be older than the
        highest version accepted for its id (in memory and in ``state_dir``), must not be
        that version under another digest, and — for an id the trust policy names no rule
        for — must be signed by a key the id is bound to (trust on first use, spec/trust.md
        §6). Its grammar is then checked and compiled (or taken from a cache) and, when the
        policy's rule for the id has ``(compatibility MODE)``, the descriptor must be proved
        compatible in that mode with the one accepted before it (§6.1); only when
        everything has passed are the state file and the registry updated. Loading the
        accepted version again is a no-op.

        Raises :class:`TrustError` (``"descriptor verification failed"``, the cause in
        ``reason``) for a signature, policy, binding, rollback, expiry, equivocation or
        compatibility refusal, or an unsigned descriptor without the opt-in;
        :class:`MalformedError`/:class:`LimitError` for its text; :class:`DescriptorError`
        for its structure (a verified payload that is not a descriptor included);
        :class:`GrammarError` for a grammar that is refused. After any refusal the registry
        and the state directory are unchanged.
        """
        prepared = self.prepare(payload, allow_unsigned=allow_unsigned, now=now)
        current = self._protocols.get(prepared.descriptor.id)
        if current is not None and current.digest == prepared.descriptor.digest:
            return current
        self.record(prepared)
        return self.install(prepared)

    def verify(self, payload: bytes, *, allow_unsigned: bool = False,
               now: int | None = None) -> VerifiedDescriptor:
        """Every check :meth:`load` makes, the grammar's included, without loading or
        recording anything. Returns the descriptor and the key ids that signed it (empty for
        an unsigned one). Raises as :meth:`load`."""
        prepared = self.prepare(payload, allow_unsigned=allow_unsigned, now=now)
        return VerifiedDescriptor(prepared.descriptor, prepared.signers, prepared.payload)

    def prepare(self, payload: bytes, *, allow_unsigned: bool = False,
                now: int | None = None) -> PreparedDescriptor:
        """Every check of :meth:`load`, the grammar compiled, and nothing changed: the
        slow half of loading, safe to run in a worker thread while the registry is used
        elsewhere. Finish with :meth:`record` and :meth:`install`. Raises as :meth:`load`."""
        descriptor, signers, keys, raw = self._admit(payload, allow_unsigned, now)
        compiled, source = self.compiled_from(descriptor.grammar,
                                              starts=descriptor.start_rules)
        checked: frozenset[str] = frozenset()
        if self._compat_mode(str(descriptor.id)) is not None:  # after the guarded compile
            # Read the records again: another writer may have replaced one since _admit,
            # and a newer version there is a rollback, not an incompatibility.
            self._check_record(descriptor, keys, self._memory_record(descriptor.id))
            accepted = [p.descriptor for p in (self._protocols.get(descriptor.id),)
                        if p is not None]
            if self.state is not None:
                record = self.state.get(str(descriptor.id))
                self._check_record(descriptor, keys, record)
                stored = self._stored_descriptor(record)
                if stored is not None:
                    accepted.append(stored)
            checked = self._check_compatible(descriptor, accepted)
        return PreparedDescriptor(descriptor, signers, keys, compiled, source, raw, checked)

    def record(self, prepared: PreparedDescriptor) -> None:
        """Record ``prepared`` as accepted in the state directory (nothing without one).
        Under the state lock the current record is read again and the rollback,
        equivocation and key-binding decisions are taken once more against it, so two
        sessions (or processes) recording different versions at once cannot leave the
        older one recorded. So is the compatibility the policy requires (spec/trust.md
        §6.1), against the accepted descriptor on record, unless :meth:`prepare` already
        compared with that very descriptor (a record replaced meanwhile is compared under
        the lock). The record keeps the descriptor's exact bytes; the accepted version
        again adds them to a record written without them. Raises :class:`TrustError` when
        a decision refuses, or the lock cannot be had; the state is then unchanged."""
        if not isinstance(prepared, PreparedDescriptor):
            raise TypeError("record takes what Registry.prepare returned")
        descriptor = prepared.descriptor
        ident = str(descriptor.id)
        if self.state is None:
            return
        raw = prepared.payload if type(prepared.payload) is bytes \
            and digest_of(prepared.payload) == descriptor.digest else None

        def decide(stored: StateRecord | None) -> StateRecord | None:
            self._check_record(descriptor, prepared.keys, stored)
            if stored is not None and stored.version == descriptor.version:
                if stored.descriptor is None and raw is not None:
                    return replace(stored, descriptor=raw)  # an older record: add the bytes
                return stored  # the accepted version again: nothing to write
            if self._compat_mode(ident) is not None:
                accepted = self._stored_descriptor(stored)
                if accepted is not None:
                    self._check_compatible(descriptor, [accepted], prepared.checked)
            bound = stored.keys if stored is not None and stored.keys else prepared.keys
            return StateRecord(ident, descriptor.version, descriptor.digest, bound, raw)

        self.state.update(ident, decide)

    def install(self, prepared: PreparedDescriptor) -> Protocol:
        """Register ``prepared`` in this registry (memory only; see :meth:`record`) and
        return the protocol. Raises :class:`TrustError` if a newer version or another
        digest of that version was registered since it was prepared."""
        if not isinstance(prepared, PreparedDescriptor):
            raise TypeError("install takes what Registry.prepare returned")
        descriptor = prepared.descriptor
        current = self._protocols.get(descriptor.id)
        if current is not None and current.digest == descriptor.digest:
            return current
        self._check_record(descriptor, prepared.keys, self._memory_record(descriptor.id))
        if current is not None and self._compat_mode(str(descriptor.id)) is not None:
            self._check_compatible(descriptor, [current.descriptor], prepared.checked)
        protocol = Protocol.from_compiled(descriptor, prepared.compiled)
        self._register(protocol)
        if prepared.keys and str(descriptor.id) not in self._bindings:
            self._bindings[str(descriptor.id)] = prepared.keys
        return protocol

    def abandon(self) -> None:
        """The owner of this registry has gone (a server's session whose peer left): a
        compile waiting or running for it stops with :class:`LimitError`, so a peer cannot
        queue compiles and disconnect. Nothing else changes; do not prepare with it again."""
        self._abandoned = True

    def adopt(self, protocol: Protocol) -> None:
        """Register ``protocol``, already loaded by another registry of this process (one
        whose trust decisions this one shares, such as a server's preloaded protocols), so
        it is neither verified nor compiled again. Raises :class:`TrustError` if this
        registry holds a newer version or another digest of that version."""
        if not isinstance(protocol, Protocol):
            raise TypeError("adopt takes a loaded cbcl Protocol")
        current = self._protocols.get(protocol.id)
        if current is protocol:
            return
        self._check_record(protocol.descriptor, (), self._memory_record(protocol.id))
        if current is not None and self._compat_mode(str(protocol.id)) is not None:
            self._check_compatible(protocol.descriptor, [current.descriptor])
        self._register(protocol)

    def _memory_record(self, ident: Symbol) -> StateRecord | None:
        current = self._protocols.get(ident)
        if current is None:
            return None
        return StateRecord(str(ident), current.descriptor.version, current.digest,
                           self._bindings.get(str(ident), ()))

    def _check_record(self, descriptor: ProtocolDescriptor, keys: tuple[str, ...],
                      record: StateRecord | None) -> None:
        """Rollback, equivocation and key binding against one record."""
        if record is None:
            return
        ident = str(descriptor.id)
        if descriptor.version < record.version:
            raise TrustError(_FAILED, reason=f"rollback: {ident} version "
                             f"{descriptor.version} is older than the accepted version "
                             f"{record.version}", cause="rollback")
        if descriptor.version == record.version and descriptor.digest != record.digest:
            raise TrustError(_FAILED, reason=f"equivocation: {ident} version "
                             f"{descriptor.version} is {descriptor.digest}, but "
                             f"{record.digest} was accepted for it", cause="equivocation")
        if keys and record.keys and descriptor.digest != record.digest \
                and self._binding_applies(ident) and not set(keys) & set(record.keys):
            raise TrustError(_FAILED, reason=f"key binding: {ident} is bound to the key(s) "
                             "that signed its first accepted descriptor, and none of them "
                             "signed this one (a (protocol …) rule in policy.cbcl decides "
                             "otherwise)", cause="key-binding")

    def _compat_mode(self, ident: str) -> str | None:
        """The compatibility mode the trust policy requires for ``ident``, or ``None``."""
        return None if self.trust is None else self.trust.policy.compatibility_for(ident)

    def _stored_descriptor(self, record: StateRecord | None) -> ProtocolDescriptor | None:
        """The accepted descriptor a state record holds (``None``: no record, or one
        written without the bytes). Its bytes have the record's digest (checked when it was
        read); one that no longer reads under this registry's limits, or is of another id,
        cannot be compared with, so the update is refused."""
        if record is None or record.descriptor is None:
            return None
        try:
            descriptor = read_descriptor(record.descriptor, limits=self.limits)
        except CBCLError as exc:
            problem = exc.one_line()
        else:
            if str(descriptor.id) == record.protocol:
                return descriptor
            problem = f"it is a descriptor of {descriptor.id}"
        raise TrustError(_FAILED, reason=f"incompatible: {record.protocol} version "
                         f"{record.version} on record cannot be compared with "
                         f"({_peer(problem)}); the update is refused", cause="incompatible")

    def _check_compatible(self, descriptor: ProtocolDescriptor,
                          accepted: Iterable[ProtocolDescriptor],
                          skip: frozenset[str] = frozenset()) -> frozenset[str]:
        """Refuse ``descriptor`` unless it is proved compatible, in the mode the policy
        requires for its id, with each accepted descriptor (but those whose digest is in
        ``skip``, already compared, and itself). Returns the digests compared with, and
        ``skip``. The comparison compiles grammars through :meth:`compiled` (guarded,
        cached) and is bounded by ``compat_limits``; its verdict is remembered in the
        grammar cache, so the same update is refused again at once."""

        ident = str(descriptor.id)
        mode = self._compat_mode(ident)
        checked = set(skip)
        if mode is None:
            return frozenset(checked)
        for old in accepted:
            if old.digest == descriptor.digest or old.digest in checked:
                continue
            key = (f"{mode} {old.digest} {descriptor.digest} {self.compat_limits!r} "
                   f"{self.grammar_limits!r}")
            verdict: tuple[str, str] | None = self.grammar_cache.verdicts.recall(key)
            if verdict is None:
                found = self._compare(old, descriptor, mode)
                if found.witness is not None:
                    intent, accepted_by, text = found.witness
                    by, not_by = (old, descriptor) if accepted_by == "old" \
                        else (descriptor, old)
                    detail = (f"witness {intent}: accepted by version {by.version}, "
                              f"refused by version {not_by.version}: {_peer(text)}")
                elif found.reason.startswith(UNCOMPILED):
                    detail = UNCOMPILED + _peer(found.reason[len(UNCOMPILED):])
                else:
                    detail = _peer(found.reason) if found.reason else ""
                verdict = (found.verdict, detail)
                if not found.reason.startswith(UNCOMPILED):
                    self.grammar_cache.verdicts.remember(key, verdict)
            if verdict[0] != COMPATIBLE:
                raise TrustError(_FAILED, reason=f"incompatible: {ident} version "
                                 f"{descriptor.version} is not proved {mode} compatible "
                                 f"with the accepted version {old.version}, as the trust "
                                 f"policy requires ({verdict[0]}; {verdict[1]})",
                                 cause="incompatible")
            checked.add(old.digest)
        return frozenset(checked)

    def _compare(self, old: ProtocolDescriptor, new: ProtocolDescriptor,
                 mode: str) -> CompatVerdict:
        """The policy's comparison of ``new`` with ``old``: compile work, so where this
        registry isolates its compiles it runs in the guarded worker under the compile
        gate (:func:`~cbcl.protocol._compat.compare_guarded`: its CPU, memory and time
        limits, stopped when the registry is abandoned), else here. Raises
        :class:`LimitError` when the gate or the worker refuses it."""
        if not self.isolate:
            return compare(old, new, mode=mode, limits=self.compat_limits,
                           grammar_limits=self.grammar_limits,
                           compile=lambda d: self.compiled(d.grammar, starts=d.start_rules))
        gate = self.compile_gate
        with contextlib.nullcontext() if gate is None else gate.slot(self.compile_wait):
            if self._abandoned:
                raise LimitError("the comparison was abandoned: nobody waits for it",
                                 limit="abandoned", maximum=0)
            return compare_guarded(old, new, mode=mode, limits=self.compat_limits,
                                   grammar_limits=self.grammar_limits,
                                   read_limits=self.limits, timeout=self.compile_timeout,
                                   memory=self.compile_memory,
                                   cancelled=lambda: self._abandoned,
                                   max_table_bytes=self.max_compiled_bytes)

    def _binding_applies(self, ident: str) -> bool:
        """Trust on first use governs ids the policy has no ``(protocol …)`` rule for."""
        return self.trust is None or ident not in self.trust.policy.protocols

    def _admit(self, payload: bytes, allow_unsigned: bool, now: int | None,
               ) -> tuple[ProtocolDescriptor, tuple[str, ...], tuple[str, ...], bytes]:
        """Signatures, policy, expiry, rollback, equivocation and key binding: everything
        but the grammar and compatibility. Changes nothing. Returns the descriptor, its
        signers, their fingerprints and the descriptor's exact bytes."""
        if not isinstance(payload, (bytes, bytearray, memoryview)):
            raise TypeError(f"a descriptor is bytes, not {type(payload).__name__}")
        if now is None:
            now = self._clock()
        if type(now) is not int:
            raise TypeError("now must be Unix time in milliseconds, an int")
        payload = bytes(payload)
        document = read(payload, limits=self.limits)
        signed = type(document) is tuple and bool(document) \
            and document[0] == Symbol("signed-descriptor")
        signers: tuple[str, ...] = ()
        keys: tuple[str, ...] = ()
        if signed:
            if self.trust is None:
                raise TrustError(_FAILED, reason="signed descriptor, but the registry has no "
                                 "trust store to verify it (trust=…, --trust)", cause="untrusted")
            verified = self.trust.verify_descriptor(payload, limits=self.limits)
            descriptor, signers, raw = verified.descriptor, verified.signers, verified.payload
            keys = tuple(sorted({fingerprint for fingerprint in map(
                self.trust.fingerprint, signers) if fingerprint is not None}))
        elif not allow_unsigned:
            raise TrustError(_FAILED, reason="unsigned descriptor: it loads only with "
                             "allow_unsigned=True (--allow-unsigned)", cause="unsigned")
        else:
            descriptor, raw = read_descriptor(payload, limits=self.limits), payload
        ident = str(descriptor.id)
        if descriptor.expires is not None and now >= descriptor.expires:
            raise TrustError(_FAILED, reason=f"expired: {ident} version {descriptor.version} "
                             f"expired at {descriptor.expires}, now is {now}", cause="expired")
        self._check_record(descriptor, keys, self._memory_record(descriptor.id))
        if self.state is not None:
            self._check_record(descriptor, keys, self.state.get(ident))
        return descriptor, signers, keys, raw

    def compiled(self, grammar: str, *, starts: tuple[str, ...] = ("body",)
                 ) -> CompiledGrammar:
        """The compiled form of an LALR(1) grammar with the start rules ``starts``, from a
        cache or compiled now.

        Raises :class:`GrammarError` when the grammar is refused, compiled tables over
        ``max_compiled_bytes`` included (both remembered, so the same grammar is refused at
        once next time). Safe to call from several threads.
        """
        return self.compiled_from(grammar, starts=starts)[0]

    def compiled_from(self, grammar: str, *, starts: tuple[str, ...] = ("body",)
                      ) -> tuple[CompiledGrammar, str]:
        """:meth:`compiled`, and where it came from: ``compiled``, ``memory cache`` or
        ``disk cache``. Raises as :meth:`compiled`, and ``ValueError`` for ``starts`` that
        are not distinct rule names."""
        starts = check_starts(starts)
        key = _cache_key(grammar, self.grammar_limits, starts)
        refused = self.grammar_cache.refused.recall(key)
        if refused is not None:
            raise GrammarError(refused.message, verdict=refused.verdict,
                               position=refused.position, context=refused.context)
        oversized: TablesTooLarge | None = self.grammar_cache.oversized.recall(key)
        if oversized is not None and oversized.size > self.max_compiled_bytes:
            raise self._too_large(oversized.size, oversized)
        cached = self.grammar_cache.compiled.recall_sized(key)
        if cached is not None:
            hit, hit_size = cached
            if hit_size > self.max_compiled_bytes:
                raise self._too_large(hit_size)
            return hit, "memory cache"
        compiled: CompiledGrammar | None = None
        fresh = False
        if self.disk is not None:
            data = self.disk.get(key)
            if data is not None:
                try:
                    compiled = from_data(data)
                except ValueError:
                    compiled = None
        if compiled is None:
            try:
                compiled = self._compile_gated(key, grammar, starts)
            except TablesTooLarge as exc:  # this registry's limit, not a verdict
                self.grammar_cache.oversized.remember(key, exc)
                raise
            except GrammarError as exc:
                self.grammar_cache.refused.remember(key, exc)
                raise
            if compiled.verdict != LALR1:
                error = GrammarError(f"grammar is not loadable: {compiled.verdict}\n"
                                     f"{compiled.report}", verdict=compiled.verdict)
                self.grammar_cache.refused.remember(key, error)
                raise error
            fresh = True
        size = compiled_size(compiled)
        if size > self.max_compiled_bytes:
            error = self._too_large(size)
            self.grammar_cache.oversized.remember(key, error)
            raise error
        if fresh and self.disk is not None:
            self.disk.put(key, to_data(compiled))
        self.grammar_cache.compiled.remember(key, compiled, size)
        return compiled, "compiled" if fresh else "disk cache"

    def _too_large(self, size: int, found: TablesTooLarge | None = None) -> TablesTooLarge:
        """The refusal of a grammar of ``size`` bytes by this registry's limit (``found``:
        the refusal, by another limit perhaps, that measured it)."""
        if found is None:
            return TablesTooLarge(size, self.max_compiled_bytes)
        return TablesTooLarge(size, self.max_compiled_bytes, exact=found.exact,
                              states=found.states, measure=found.measure)

    def _compile_gated(self, key: str, grammar: str, starts: tuple[str, ...]
                       ) -> CompiledGrammar:
        gate = self.compile_gate
        if gate is None:
            return self._compile(grammar, starts)
        with gate.slot(self.compile_wait):
            if self._abandoned:
                raise LimitError("the compile was abandoned: nobody waits for it",
                                 limit="abandoned", maximum=0)
            # Another thread may have finished it meanwhile.
            refused = self.grammar_cache.refused.recall(key)
            if refused is not None:
                raise GrammarError(refused.message, verdict=refused.verdict,
                                   position=refused.position, context=refused.context)
            oversized: TablesTooLarge | None = self.grammar_cache.oversized.recall(key)
            if oversized is not None and oversized.size > self.max_compiled_bytes:
                raise self._too_large(oversized.size, oversized)
            done: CompiledGrammar | None = self.grammar_cache.compiled.recall(key)
            return done if done is not None else self._compile(grammar, starts)

    def _compile(self, grammar: str, starts: tuple[str, ...]) -> CompiledGrammar:
        if self.isolate:
            return compile_guarded(grammar, self.grammar_limits, starts=starts,
                                   timeout=self.compile_timeout,
                                   cancelled=lambda: self._abandoned,
                                   memory=self.compile_memory,
                                   max_table_bytes=self.max_compiled_bytes)
        return compile_grammar(grammar, self.grammar_limits, starts=starts,
                               max_table_bytes=self.max_compiled_bytes)

