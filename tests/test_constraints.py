"""Constraints (spec/conversations.md §5): rules of a descriptor, checked at load, applied on
both sides in text and binary, with earlier messages where a conversation is tracked."""

from __future__ import annotations

import contextlib
import hashlib
from collections.abc import Callable
from pathlib import Path

import pytest
from hypothesis import given, settings, strategies as st
from test_session import (
    A_URI,
    B_URI,
    KEY,
    NOW,
    SessionPair,
    cfp,
    initiator,
    propose,
    query,
    responder,
)

import cbcl
from cbcl import Decoder, Encoder, sign_descriptor
from cbcl.descriptor import read_descriptor
from cbcl.protocol import _constraints
from cbcl.protocol._constraints import (
    MAX_MESSAGE_CHARS,
    MAX_RULE_NODES,
    MAX_RULES,
    MAX_STEPS,
    ConstraintError,
)
from cbcl.protocol._evaluator import run
from cbcl.session import ProtocolMessage, RemoteProtocolError
from cbcl.session._reasons import error_code

ROOT = Path(__file__).resolve().parent.parent
CONTRACT_NET = (ROOT / "descriptors" / "contract-net-v1.cbcl").read_bytes()
CANON_A = (ROOT / "descriptors" / "canon-a-v1.cbcl").read_bytes()
#: canon-a/v1 without its constraints section (its functions list kept).
CANON_BARE = CANON_A[:CANON_A.index(b"\n  (constraints")] + b")\n"

RULES = b"""
  (constraints
    (rule eta-bounded (intents PROPOSE)
      (check (or (not (has :bid :eta)) (<= (field :bid :eta) 100)))
      (message "an eta is at most 100"))
    (rule reply-by-after-timestamp (intents CFP)
      (check (or (not (has-envelope reply-by)) (not (has-envelope timestamp))
                 (> (envelope reply-by) (envelope timestamp))))
      (message "reply-by is not after timestamp"))
    (rule price-within-budget (intents PROPOSE)
      (check (if (seen CFP)
                 (<= (field :bid :price) (earlier CFP (field :task :params :budget)))
                 false))
      (message "the price exceeds the CFP's budget"))
    (rule accept-names-the-proposal (intents ACCEPT)
      (check (= (field :task-id) (earlier PROPOSE (field :task-id))))
      (message "an ACCEPT names the task of the proposal")))"""


def with_rules(base: bytes, rules: bytes, *, version: int = 3) -> bytes:
    """``base`` (a shipped descriptor) with ``rules`` as its last section; contract-net/v1's
    (shipped as version 2) as ``version``, any other at its own."""
    end = base.rindex(b")")
    return (base[:end] + rules + base[end:]).replace(
        b"(id contract-net/v1)\n  (version 2)",
        f"(id contract-net/v1)\n  (version {version})".encode())


RULED = with_rules(CONTRACT_NET, RULES)


def registry_of(*payloads: bytes) -> cbcl.Registry:
    registry = cbcl.Registry(disk_cache=False, isolate=False)
    for payload in payloads:
        registry.load(payload, allow_unsigned=True)
    return registry


REGISTRY = registry_of(RULED, CANON_A)


def message(intent: str, body: str, *, protocol: str = "contract-net/v1",
            extra: str = "") -> bytes:
    return (f'(CBCL/1.0 (message-id "m") (sender agent://a) (receiver agent://b) '
            f"(intent {intent}) (protocol {protocol}) {extra}(body {body}))").encode()


def proposal(eta: int | None = None, price: str = "1.0") -> str:
    eta_part = "" if eta is None else f" :eta {eta}"
    return f'(proposal :task-id "t1" :bid (bid :price {price} :currency EUR{eta_part}))'


def refusals(data: bytes, registry: cbcl.Registry = REGISTRY) -> list[type[Exception]]:
    """What each receiving and sending path says of ``data``: nothing where it accepts, the
    error's class where it refuses (the text parser, validate, both encoders, the decoders
    in C and in Python, the one-shot decoder)."""
    out: list[type[Exception]] = []

    def run(call: object) -> None:
        try:
            call()  # type: ignore[operator]
        except cbcl.CBCLError as exc:
            out.append(type(exc))

    run(lambda: cbcl.parse(data, registry=registry))
    run(lambda: cbcl.parse(data.decode(), registry=registry))  # (the careful path)
    unchecked = cbcl.parse(data, registry=registry, envelope_only=True)
    run(lambda: cbcl.validate(unchecked, registry=registry))
    run(lambda: Encoder(registry).encode(unchecked))
    frame = Encoder(registry, validate=False).encode(unchecked)
    run(lambda: Decoder(registry).decode(frame))
    run(lambda: Decoder(registry, pure_python=True).decode(frame))
    run(lambda: cbcl.decode(frame, registry=registry))
    return out


# --------------------------------------------------------------------------- the boundary

@pytest.mark.parametrize(("data", "accepted"), [
    (message("PROPOSE", proposal(100)), True),
    (message("PROPOSE", proposal(101)), False),
    (message("PROPOSE", proposal()), True),  # an absent eta the rule allows
    (message("CFP", '(cfp :task (task :id "t" :action x) :deadline 5)',
             extra="(reply-by 11) (timestamp 10) "), True),
    (message("CFP", '(cfp :task (task :id "t" :action x) :deadline 5)',
             extra="(reply-by 10) (timestamp 10) "), False),
    (message("CFP", '(cfp :task (task :id "t" :action x) :deadline 5)',
             extra="(reply-by 10) "), True),
])
def test_each_stateless_rule_at_its_boundary_in_text_and_binary(data: bytes,
                                                                 accepted: bool) -> None:
    got = refusals(data)
    assert got == ([] if accepted else [ConstraintError] * 7)


def test_a_refusal_names_the_rule_and_its_message() -> None:
    with pytest.raises(ConstraintError) as caught:
        cbcl.parse(message("PROPOSE", proposal(101)), registry=REGISTRY)
    error = caught.value
    assert (error.rule, error.refusal, error.kind, error.exit_code) == (
        "eta-bounded", "an eta is at most 100", "constraint", 7)
    assert isinstance(error, cbcl.SchemaError)
    assert error_code(error) == "schema"  # the NOT-UNDERSTOOD a peer gets
    assert "constraint eta-bounded: an eta is at most 100" in str(error)


def test_canon_a_needs_a_city_and_the_body_of_its_intent() -> None:
    def canon(intent: str, body: str) -> bytes:
        return message(intent, body, protocol="canon-a/v1")

    assert refusals(canon("QUERY", '(query weather :city "Paris")')) == []
    assert refusals(canon("QUERY", "(query weather)")) == [ConstraintError] * 7
    # Another intent's body: version 3's grammar refuses it (each intent has its own start
    # rule) before the rules that said so in version 2 (spec/declarations.md §4).
    assert refusals(canon("QUERY", '(deny :reason "x")')) == [cbcl.BodyError] * 7
    assert refusals(canon("REFUSE", '(deny :reason "x")')) == []
    assert refusals(canon("FAILURE", '(deny :reason "x")')) == [cbcl.BodyError] * 7
    with pytest.raises(ConstraintError, match=r"query-needs-city.*needs a city"):
        cbcl.parse(canon("QUERY", "(query weather :unit celsius)"), registry=REGISTRY)
    for example in sorted((ROOT / "descriptors" / "examples").glob("canon-a-v1*.cbcl")):
        cbcl.parse(example.read_bytes(), registry=REGISTRY)


def test_rules_with_earlier_are_left_to_the_conversation() -> None:
    # No CFP before it: price-within-budget does not hold, but stateless parse skips it.
    cbcl.parse(message("PROPOSE", proposal()), registry=REGISTRY)
    cbcl.parse(message("ACCEPT", '(accept-proposal :task-id "zz")'), registry=REGISTRY)


def test_a_protocol_without_constraints_stays_on_the_fast_paths() -> None:
    registry = registry_of(CONTRACT_NET.replace(b"(version 2)", b"(version 3)"), CANON_A)
    fast = registry._protocols_by_id()
    assert set(map(str, fast)) == {"contract-net/v1"}  # canon-a/v1 has constraints
    assert {str(p.id) for p in registry.protocols()} == {"contract-net/v1", "canon-a/v1"}
    assert registry.get("canon-a/v1") is not None
    # A version with constraints replaces one without: it leaves the fast paths.
    registry.load(with_rules(CONTRACT_NET, RULES, version=4), allow_unsigned=True)
    assert fast is registry._protocols_by_id() and not fast


# --------------------------------------------------------------------------- loading

def _rule(check: str, *, name: str = "r", intents: str = "PROPOSE",
          text: str = "refused") -> bytes:
    return (f'(rule {name} (intents {intents}) (check {check}) (message "{text}"))').encode()


def _load(*rules: bytes, base: bytes = CONTRACT_NET) -> cbcl.descriptor.ProtocolDescriptor:
    return read_descriptor(with_rules(base, b"\n  (constraints " + b" ".join(rules) + b")"))


@pytest.mark.parametrize(("rule", "base", "found"), [
    (_rule("(expt 2 3)"), CONTRACT_NET, "unknown function expt"),
    (_rule("(< 1)"), CONTRACT_NET, "< takes at least 2 arguments, not 1"),
    (_rule("(not true false)"), CONTRACT_NET, "not takes exactly 1"),
    (_rule("(= (head) 1)", intents="QUERY"),
     CANON_BARE.replace(b"(functions =)", b"(functions <)"), "function = is not listed"),
    (_rule("(has :city)", intents="PROPOSE"), CANON_BARE, "does not govern"),
    (_rule("(seen CFP)", intents="QUERY"), CANON_BARE, "needs a (conversation"),
    (_rule("(earlier CFP (earlier CFP true))"), CONTRACT_NET, "not allowed inside earlier"),
    (_rule("(earlier QUERY true)"), CONTRACT_NET, "does not govern"),
    (_rule("(< (now) 1)"), CONTRACT_NET, "(now) is not allowed"),
    (_rule("(= x 1)"), CONTRACT_NET, "unbound symbol x"),
    (_rule("(field price)"), CONTRACT_NET, "one or more keywords"),
    (_rule("(envelope subject)"), CONTRACT_NET, "envelope takes one field name"),
    (_rule("(quote (a b))"), CONTRACT_NET, "quote takes one atom"),
    (_rule("true") + b" " + _rule("true"), CONTRACT_NET, "rule r is defined twice"),
    (b'(rule r (intents PROPOSE) (message "m") (check true))', CONTRACT_NET,
     "in the order"),
    (_rule("true", intents=""), CONTRACT_NET, "at least one intent"),
])
def test_malformed_rules_are_refused_at_load(rule: bytes, base: bytes, found: str) -> None:
    with pytest.raises(cbcl.DescriptorError) as caught:
        _load(rule, base=base)
    assert found in str(caught.value)


def test_a_descriptor_without_functions_may_call_none() -> None:
    bare = CANON_A.replace(b"\n  (functions =)", b"")
    with pytest.raises(cbcl.DescriptorError, match="function = is not listed"):
        read_descriptor(bare)
    end = bare.index(b"\n  (constraints")
    no_rules = bare[:end] + b")\n"
    read_descriptor(no_rules)
    read_descriptor(with_rules(no_rules, b"\n  (constraints " + _rule(
        "(has :city)", intents="QUERY") + b")"))  # forms are not functions


def test_constraints_come_last() -> None:
    payload = with_rules(CONTRACT_NET, b"\n  (constraints)")
    read_descriptor(payload)
    moved = payload.replace(b"\n  (constraints)", b"").replace(
        b"\n  (functions", b"\n  (constraints)\n  (functions", 1)
    with pytest.raises(cbcl.DescriptorError, match="out of order"):
        read_descriptor(moved)


def test_rules_per_descriptor() -> None:
    rules = [_rule("true", name=f"r{i}") for i in range(MAX_RULES + 1)]
    section = _load(*rules[:MAX_RULES]).constraints
    assert type(section) is tuple and len(section) == MAX_RULES + 1  # (its name, then rules)
    with pytest.raises(cbcl.DescriptorError, match=f"more than the {MAX_RULES}"):
        _load(*rules)


def test_nodes_per_rule() -> None:
    # (= 1 1 …): the list, its name and k arguments are k + 2 nodes.
    ones = " ".join(["1"] * (MAX_RULE_NODES - 2))
    _load(_rule(f"(= {ones})"))
    with pytest.raises(cbcl.DescriptorError, match=f"more than {MAX_RULE_NODES} nodes"):
        _load(_rule(f"(= {ones} 1)"))
    path = " ".join([":k"] * (MAX_RULE_NODES - 2))  # (field :k …) counts its keywords
    _load(_rule(f"(has {path})"))
    with pytest.raises(cbcl.DescriptorError, match="nodes"):
        _load(_rule(f"(has {path} :k)"))


def test_depth_per_rule() -> None:
    def nested(calls: int) -> str:
        return "(not " * (calls - 1) + "(has :k)" + ")" * (calls - 1)

    _load(_rule(nested(32)))
    with pytest.raises(cbcl.DescriptorError, match="nested more than 32"):
        _load(_rule(nested(33)))


def test_message_length() -> None:
    _load(_rule("true", text="m" * MAX_MESSAGE_CHARS))
    with pytest.raises(cbcl.DescriptorError, match=f"more than {MAX_MESSAGE_CHARS}"):
        _load(_rule("true", text="m" * (MAX_MESSAGE_CHARS + 1)))


def test_the_step_budget_per_message() -> None:
    # (= 1 … 1) with k ones costs k + 1 steps; 16 rules of 255 and one of 16: 4,096.
    def rules(last: int) -> list[bytes]:
        full = " ".join(["1"] * 254)
        return [_rule(f"(= {full})", name=f"r{i}") for i in range(16)] + [
            _rule("(= " + " ".join(["1"] * (last - 1)) + ")", name="last")]

    assert MAX_STEPS == 16 * 255 + 16
    data = message("PROPOSE", proposal())
    fits = registry_of(with_rules(CONTRACT_NET, b"\n  (constraints " + b" ".join(rules(16))
                                  + b")"))
    cbcl.parse(data, registry=fits)
    over = registry_of(with_rules(CONTRACT_NET, b"\n  (constraints " + b" ".join(rules(17))
                                  + b")"))
    with pytest.raises(cbcl.LimitError, match=f"budget of {MAX_STEPS}") as caught:
        cbcl.parse(data, registry=over)
    assert caught.value.limit == "constraint_steps"


def test_absent_data_refuses_with_what_was_absent() -> None:
    registry = registry_of(with_rules(CONTRACT_NET, b"\n  (constraints "
                                      + _rule("(<= (field :bid :eta) 100)") + b")"))
    with pytest.raises(ConstraintError, match=r"the body has no \[:bid\]\[:eta\]"):
        cbcl.parse(message("PROPOSE", proposal()), registry=registry)
    cbcl.parse(message("PROPOSE", proposal(3)), registry=registry)


# --------------------------------------------------------------------------- signatures

def test_the_section_is_part_of_the_signed_bytes() -> None:
    store = cbcl.TrustStore({"demo": KEY.public_key()})
    signed = sign_descriptor(RULED, [("demo", KEY)])
    registry = cbcl.Registry(trust=store, disk_cache=False, isolate=False)
    protocol = registry.load(signed)
    assert protocol.constraints is not None
    assert protocol.digest == "sha256:" + hashlib.sha256(RULED).hexdigest()
    tampered = signed.replace(b"at most 100", b"at most 999")
    assert tampered != signed
    with pytest.raises(cbcl.TrustError):
        cbcl.Registry(trust=store, disk_cache=False, isolate=False).load(tampered)


# --------------------------------------------------------------------------- conversations

SIGNED_RULED = sign_descriptor(RULED, [("demo", KEY)])
DIGEST_RULED = "sha256:" + hashlib.sha256(RULED).hexdigest()


def _pair() -> SessionPair:
    pair = SessionPair(initiator(RULED), responder())
    pair.handshake(query(DIGEST_RULED, 3), SIGNED_RULED)
    return pair


def _cfp(budget: str) -> cbcl.Message:
    base = cfp()
    return cbcl.Message(message_id=base.message_id, sender=base.sender,
                        receiver=base.receiver, intent="CFP", protocol=base.protocol,
                        conversation_id=base.conversation_id, body=cbcl.read(
                            f'(cfp :task (task :id "t1" :action render :params (:budget '
                            f"{budget})) :deadline 5)".encode()))


def _propose(price: str) -> cbcl.Message:
    base = propose()
    return cbcl.Message(message_id=base.message_id, sender=base.sender,
                        receiver=base.receiver, intent="PROPOSE", protocol=base.protocol,
                        conversation_id=base.conversation_id, in_reply_to="cn-1",
                        body=cbcl.read(proposal(price=price).encode()))


@pytest.mark.parametrize(("price", "accepted"), [("10.00", True), ("10.01", False)])
def test_earlier_rules_across_a_two_party_session(price: str, accepted: bool) -> None:
    pair = _pair()
    pair.feed(pair.b, pair.a.send(ProtocolMessage(_cfp("10")), now=NOW))
    if accepted:
        (got,) = pair.feed(pair.a, pair.b.send(ProtocolMessage(_propose(price)), now=NOW))
        assert isinstance(got, ProtocolMessage) and str(got.step.after) == "proposed"  # type: ignore[union-attr]
        return
    # The sender refuses it and sends nothing …
    with pytest.raises(ConstraintError, match="price-within-budget"):
        pair.b.send(ProtocolMessage(_propose(price)), now=NOW)
    assert pair.b.data_to_send() == b""
    # … and a sender that does not check is refused by the receiver, with `schema`.
    trusting = SessionPair(initiator(RULED), responder(validate_outgoing=False))
    trusting.handshake(query(DIGEST_RULED, 3), SIGNED_RULED)
    trusting.feed(trusting.b, trusting.a.send(ProtocolMessage(_cfp("10")), now=NOW))
    tracker = trusting.b.tracker
    assert tracker is not None
    thread = tracker.get("job-1", B_URI)
    assert thread is not None
    thread.constraints = None  # (b's own check of what it sends, off: a careless peer)
    data = trusting.b.send(ProtocolMessage(_propose(price)), now=NOW)
    trusting.a.receive_data(data)
    with pytest.raises(RemoteProtocolError) as caught:
        trusting.a.next_event(now=NOW)
    assert caught.value.code == "schema"


def test_the_history_keeps_only_what_the_rules_read() -> None:
    pair = _pair()
    pair.feed(pair.b, pair.a.send(ProtocolMessage(_cfp("10")), now=NOW))
    tracker = pair.b.tracker
    assert tracker is not None
    thread = tracker.get("job-1", B_URI)
    assert thread is not None
    snapshots = thread._earlier
    (cfp_seen,) = snapshots.values()
    assert cfp_seen.values == {("field", ("task", "params", "budget")): 10}
    pair.feed(pair.a, pair.b.send(ProtocolMessage(_propose("2")), now=NOW))
    assert {i.value for i in snapshots} == {"CFP", "PROPOSE"}
    assert snapshots[cbcl.Intent.PROPOSE].values == {("field", ("task-id",)): "t1"}
    accept = cbcl.Message(message_id="cn-2", sender=A_URI, receiver=B_URI, intent="ACCEPT",
                          protocol="contract-net/v1", conversation_id="job-1",
                          body=cbcl.read(b'(accept-proposal :task-id "t2")'))
    with pytest.raises(ConstraintError, match="accept-names-the-proposal"):
        pair.a.send(ProtocolMessage(accept), now=NOW)


# --------------------------------------------------------------------------- hostile rules

FORMS = ["field", "has", "head", "envelope", "has-envelope", "seen", "earlier", "quote"]
FUNCTIONS = ["+", "-", "*", "/", "=", "!=", "<", "<=", "and", "or", "not", "if", "min"]
atoms = st.sampled_from(["1", "0", "-9223372036854775808", "9223372036854775807", "1.5",
                         '"s"', "true", "false", ":price", ":bid", "CFP", "PROPOSE",
                         "reply-by", "x", "()"])


def expressions() -> st.SearchStrategy[str]:
    return st.recursive(atoms, lambda inner: st.tuples(
        st.sampled_from(FORMS + FUNCTIONS), st.lists(inner, max_size=4)).map(
            lambda t: "(" + " ".join([t[0], *t[1]]) + ")"), max_leaves=40)


AGREED: list[str] = []


def _agree(rule: _constraints.Rule, context: _constraints._MessageContext,
           functions: frozenset[str]) -> None:
    compiled = rule.compiled
    assert compiled is not None
    assert _outcome(lambda: compiled(context, _constraints._Meter(MAX_STEPS))) == _outcome(
        lambda: run(rule.check, functions, None, MAX_STEPS, 32, "$", context)[0])


def _outcome(call: Callable[[], object]) -> tuple[str, str]:
    try:
        return "value", repr(call())
    except cbcl.CBCLError as exc:
        return type(exc).__name__, str(exc)


@settings(max_examples=150, deadline=None)
@given(st.lists(expressions(), min_size=1, max_size=4),
       st.sampled_from([proposal(), proposal(7), proposal(200, "99999999999999999999.5")]))
def test_hostile_rules_give_a_result_or_a_cbcl_error(checks: list[str], body: str) -> None:
    rules = b" ".join(_rule(check, name=f"r{i}", intents="PROPOSE CFP")
                      for i, check in enumerate(checks))
    payload = with_rules(CONTRACT_NET, b"\n  (constraints " + rules + b")")
    try:
        registry = registry_of(payload)
    except cbcl.CBCLError:
        return
    for data in (message("PROPOSE", body), message("PROPOSE", proposal())):
        with contextlib.suppress(cbcl.CBCLError):
            cbcl.parse(data, registry=registry)
    protocol = registry.get("contract-net/v1")
    assert protocol is not None and protocol.constraints is not None
    # The compiled checks and the evaluator agree: the same value or the same error.
    for data in (message("PROPOSE", body), message("PROPOSE", proposal())):
        parsed = cbcl.parse(data, registry=registry_of(CONTRACT_NET))
        for history in (None, {cbcl.Intent.CFP: _constraints.Snapshot.of(
                parsed, frozenset({("field", ("bid", "price")), ("head", ())}))}):
            for rule in protocol.constraints.rules:
                _agree(rule, _constraints._MessageContext(parsed, history),
                       protocol.constraints.functions)
                AGREED.append(rule.name)
    history = {cbcl.Intent.CFP: _constraints.Snapshot({})}
    with contextlib.suppress(cbcl.CBCLError):
        protocol.constraints.check_in_conversation(
            cbcl.parse(message("PROPOSE", proposal()), registry=registry_of(CONTRACT_NET)),
            history)


def test_an_expensive_rule_set_is_bounded_by_the_budget() -> None:
    # 32 rules of 256 nodes: 8,192 nodes, refused after 4,096 steps, whatever the message.
    wide = "(+ " + " ".join(["1"] * 251) + ")"
    rules = [_rule(f"(= {wide} 251)", name=f"r{i}") for i in range(MAX_RULES)]
    registry = registry_of(with_rules(CONTRACT_NET, b"\n  (constraints " + b" ".join(rules)
                                      + b")"))
    with pytest.raises(cbcl.LimitError):
        cbcl.parse(message("PROPOSE", proposal()), registry=registry)


# --------------------------------------------------------------------------- descriptor diff

def _diff(old: bytes, new: bytes, mode: str = "backward") -> tuple[str, str]:
    from cbcl.protocol._compat import diff_descriptors
    report = diff_descriptors(old, new, mode=mode)
    return report.verdict, report.render()


LOGIC = CANON_BARE.replace(b"(functions =)", b"(functions = and or)")
BARE = LOGIC.replace(b"(version 1)", b"(version 2)")


def _canon_rules(*rules: bytes, version: int) -> bytes:
    return with_rules(LOGIC, b"\n  (constraints " + b" ".join(rules) + b")",
                      version=version)


def test_a_new_constraint_is_breaking_backward_and_a_removed_one_forward() -> None:
    ruled = _canon_rules(_rule("(has :city)", name="city", intents="QUERY"), version=3)
    assert _diff(BARE, BARE)[0] == "compatible"
    verdict, text = _diff(BARE, ruled)
    assert verdict == "breaking" and "constraint added: city (QUERY)" in text
    assert _diff(BARE, ruled, "forward")[0] == "compatible"  # fewer bodies: forward holds
    assert _diff(ruled, BARE, "forward")[0] == "breaking"  # removed: breaking forward
    assert _diff(ruled, BARE)[0] == "compatible"
    assert _diff(ruled, ruled.replace(b"(version 3)", b"(version 4)"), "full")[0] \
        == "compatible"


def test_an_implied_constraint_is_compatible_and_an_earlier_one_unknown() -> None:
    old = _canon_rules(_rule("(has :city)", name="a", intents="QUERY"),
                       _rule("(has :unit)", name="b", intents="QUERY"), version=3)
    implied = _canon_rules(_rule("(and (has :unit) (or (has :city) (has :date)))", name="c",
                                 intents="QUERY"), version=4)
    assert _diff(old, implied)[0] == "compatible"
    assert _diff(implied, old)[0] == "breaking"  # (has :city) alone is not implied
    earlier = _canon_rules(_rule("(earlier QUERY (has :city))", name="e", intents="INFORM"),
                           version=4)
    with pytest.raises(cbcl.DescriptorError, match="needs a"):
        read_descriptor(earlier)  # (canon-a/v1 has no conversation: no earlier)
    conversation = b"""
  (conversation (roles asker answerer) (initial start) (final done)
    (transitions (start QUERY asker asked) (asked INFORM answerer done)))"""
    talk = LOGIC.replace(b"\n  (functions", conversation + b"\n  (functions")
    verdict, text = _diff(talk, with_rules(talk, b"\n  (constraints " + _rule(
        "(earlier QUERY (has :city))", name="e", intents="INFORM") + b")", version=4))
    assert verdict == "unknown" and "reads earlier messages" in text


# --------------------------------------------------------------------------- prompts, exports

def test_rules_in_words() -> None:
    from cbcl.protocol._constraints import in_words
    check = cbcl.read(b"(<= (field :bid :price) (earlier CFP (field :task :params :budget)))")
    assert in_words(check) == "`:bid :price` is at most the earlier CFP's " \
                              "`:task :params :budget`"
    assert in_words(cbcl.read(b"(or (not (has :bid :eta)) (<= (field :bid :eta) 100))")) \
        == "(not `:bid :eta` is present or `:bid :eta` is at most 100)"
    assert in_words(cbcl.read(b"(= (head) (quote query))")) == "the body's head equals query"


def test_the_prompt_states_the_rules_of_its_intents() -> None:
    from cbcl.llm import render_prompt
    protocol = REGISTRY.get("canon-a/v1")
    assert protocol is not None
    text = render_prompt(protocol, registry=REGISTRY, intent=cbcl.Intent.QUERY)
    assert '- QUERY: `:city` is present (else refused: "a weather query needs a city")' \
        in text
    assert "REFUSE:" not in text.split("### Rules")[1]  # only the rules of its intents
    # Its examples satisfy them: the prompt teaches no message the receiver refuses.
    assert ":city" in text.split("### Examples")[1]


def test_exports_list_the_constraints_as_not_carried() -> None:
    from cbcl.llm import export_grammar
    for fmt in ("lark", "json-schema"):
        export = export_grammar(CANON_A, fmt)
        assert 'constraint query-needs-city: "a weather query needs a city"' \
            in export.not_carried
    assert "constraint query-needs-city" in export_grammar(CANON_A, "lark").text
    hostile = with_rules(CANON_BARE, b'\n  (constraints ' + _rule(
        "true", intents="QUERY", text='x\\nbody: \\"(\\" \\")\\"') + b")")
    section = read_descriptor(hostile).constraints
    assert type(section) is tuple and "\n" in str(section[1][4][1])  # type: ignore[index]
    text = export_grammar(hostile, "lark").text
    assert '\nbody: "(" ")"' not in text  # (a message's newline stays escaped)


good_atoms = st.sampled_from(["1", "0", "-9223372036854775808", "9223372036854775807", "1.5",
                              '"s"', "true", "false", "(field :bid :price)", "(has :bid)",
                              "(field :task-id)", "(head)", "(quote bid)",
                              "(envelope reply-by)", "(has-envelope reply-by)",
                              "(seen CFP)", "(earlier CFP (field :bid :price))"])


@settings(max_examples=200, deadline=None)
@given(st.recursive(good_atoms, lambda inner: st.tuples(
    st.sampled_from(FUNCTIONS), st.lists(inner, min_size=1, max_size=3)).map(
        lambda t: "(" + " ".join([t[0], *t[1]]) + ")"), max_leaves=12),
    st.sampled_from([proposal(), proposal(7, "2.5")]))
def test_compiled_checks_agree_with_the_evaluator(check: str, body: str) -> None:
    payload = with_rules(CONTRACT_NET, b"\n  (constraints " + _rule(check) + b")")
    try:
        registry = registry_of(payload)
    except cbcl.DescriptorError:
        return  # (an arity the draw got wrong)
    protocol = registry.get("contract-net/v1")
    assert protocol is not None and protocol.constraints is not None
    (rule,) = protocol.constraints.rules
    parsed = cbcl.parse(message("PROPOSE", body), registry=registry_of(CONTRACT_NET))
    for history in (None, {}, {cbcl.Intent.CFP: _constraints.Snapshot.of(
            parsed, frozenset({("field", ("bid", "price"))}))}):
        _agree(rule, _constraints._MessageContext(parsed, history),
               protocol.constraints.functions)
