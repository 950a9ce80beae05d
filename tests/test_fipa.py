"""FIPA ACL (SC00070 string form): the guarded reader and the writer, the mapping to CBCL
messages and back (spec/interop.md), on real JADE output, and ``cbcl convert``.

Tests internals too: the atom types of FIPA expressions (``Word``, ``Number``,
``DateTime``) and the AID and reply-by conversions, from ``cbcl.bridges._fipa``."""

from __future__ import annotations

import contextlib
import time
from pathlib import Path

import pytest
from hypothesis import given, strategies as st

from cbcl import CBCLError, LimitError, Limits, MalformedError, Message, read
from cbcl.bridges._fipa import (
    DateTime,
    Number,
    Word,
    aid_to_uri,
    ms_to_reply_by,
    reply_by_to_ms,
    uri_to_aid,
)
from cbcl.cli import main
from cbcl.interop import (
    AgentId,
    ConversionError,
    FipaMessage,
    FipaSyntaxError,
    LossyConversionError,
    equivalent,
    fipa_to_message,
    message_to_fipa,
    read_fipa,
    write_fipa,
)
from cbcl.trust import Signature

VECTORS = Path(__file__).parent / "vectors" / "fipa"
JADE = sorted(VECTORS.glob("*.acl"))


def vector(name: str) -> bytes:
    return (VECTORS / name).read_bytes()


# --------------------------------------------------------------------------- real JADE output


@pytest.mark.parametrize("path", JADE, ids=lambda p: p.stem)
def test_every_jade_vector_reads_and_writes_back_the_same(path: Path) -> None:
    message = read_fipa(path.read_bytes())
    assert read_fipa(write_fipa(message)) == message


def test_jade_dftest_search_fields() -> None:
    m = read_fipa(vector("jade-dftest-search.acl"))
    assert m.performative == "request"
    assert m.sender == AgentId("da0@IBM10308:1099/JADE")  # (sequence ) is no address
    assert m.receivers == (AgentId("df@IBM10308:1099/JADE"),)
    assert m.reply_by == "20020314T091400500Z"
    assert m.protocol == "fipa-request"
    assert m.language == Word("FIPA-SL0") and m.ontology == Word("FIPA-Agent-Management")
    assert isinstance(m.content, str) and m.content.startswith("((action (agent-identifier")
    assert m.param("x-comment") is not None


def test_jade_receivers_with_addresses_and_resolvers() -> None:
    m = read_fipa(vector("jade-testmessages-receivers.acl"))
    assert [a.name for a in m.receivers] == ["y", "z", "z"]
    assert m.receivers[1].addresses == ("iiop://100.1/a",)
    assert m.receivers[2].resolvers == (AgentId("p"),)
    assert "\n" in str(m.content)  # JADE's content holds raw line breaks


def test_jade_quotes_in_content_are_unescaped() -> None:
    m = read_fipa(vector("jade-ams-get-description-reply.acl"))
    assert ':name "192.168.122.1:1099/JADE"' in str(m.content)
    assert m.reply_with == Word("rma@192.168.122.1:5000/JADE1435662093800")


def test_jade_request_converts_to_cbcl_and_back_to_an_equivalent_message() -> None:
    original = read_fipa(vector("jade-rma-get-description.acl"))
    message, losses = fipa_to_message(vector("jade-rma-get-description.acl"))
    assert losses == []
    assert message.intent == "REQUEST" and str(message.protocol) == "request/v1"
    assert str(message.sender) == ("fipa-aid://rma@192.168.122.1:1099/JADE"
                              "?address=http://130-000.eduroam.rwth-aachen.de:7778/acc")
    assert message.conversation_id == "C1438784720_1435754381566"
    assert isinstance(message.body, tuple) and str(message.body[0]) == "fipa-content"
    text, back_losses = message_to_fipa(message)
    assert back_losses == []
    back = read_fipa(text)
    assert equivalent(original, back)
    assert back.reply_with == Word(message.message_id)  # the id generated for it, added
    # and the CBCL message survives the FIPA text unchanged
    assert fipa_to_message(text)[0] == message


def test_jade_reply_round_trips() -> None:
    original = read_fipa(vector("jade-ams-get-description-reply.acl"))
    message, losses = fipa_to_message(original)
    assert losses == [] and message.message_id == "rma@192.168.122.1:5000/JADE1435662093800"
    assert equivalent(original, read_fipa(message_to_fipa(message)[0]))


def test_jade_user_parameter_is_a_loss_refused_without_lossy() -> None:
    with pytest.raises(LossyConversionError) as info:
        fipa_to_message(vector("jade-dftest-search.acl"))
    assert info.value.losses == ("user-defined parameter :X-comment",)
    assert info.value.exit_code == 5 and info.value.kind == "lossy"
    message, losses = fipa_to_message(vector("jade-dftest-search.acl"), lossy=True)
    assert losses == ["user-defined parameter :X-comment"]
    assert message.reply_by == 1016097240500  # 2002-03-14 09:14:00.500 UTC
    back = read_fipa(message_to_fipa(message)[0])
    assert back.reply_by == "20020314T091400500Z" and back.param("X-comment") is None


def test_several_receivers_and_resolvers_are_said() -> None:
    _, losses = fipa_to_message(vector("jade-testmessages-receivers.acl"), lossy=True)
    assert any(loss.startswith("receivers z z") for loss in losses)
    assert "user-defined parameter :X-comment" in losses


def test_a_message_without_sender_cannot_convert() -> None:
    with pytest.raises(ConversionError, match="no :sender"):
        fipa_to_message(vector("jade-testmessages-proxy-number.acl"), lossy=True)


# --------------------------------------------------------------------------- CBCL -> FIPA -> CBCL

TRACE = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"

MESSAGES = [
    Message(message_id="m-1", sender="agent://a", receiver="agent://b", intent="REQUEST",
            protocol="request/v1", conversation_id="c 1", reply_by=1767268800000,
            body=read("(request :action (action :name ping))")),
    Message(message_id="r-7", sender="agent://b", receiver="agent://a", intent="NOTIFY",
            protocol="task-assignment/v1", in_reply_to="m\"1\\", timestamp=5,
            signature=Signature("k1", "c2lnbmF0dXJl")),
    Message(message_id="x", sender="fipa-aid://n%20a?address=http://h:1/acc",
            receiver="xmpp://b@localhost", intent="QUERY", protocol="fipa-acl"),
    Message(message_id="y", sender="agent://a", receiver="agent://b", intent="CFP",
            protocol="fipa-request", reply_by=-(10**15)),
    Message(message_id="z", sender="agent://a", receiver="agent://b", intent="INFORM",
            protocol="-odd", body="text with \"quotes\" and \\ backslash\\"),
    Message(message_id="t", sender="agent://a", receiver="agent://b", intent="INFORM",
            protocol="request/v1", trace=TRACE),
]


@pytest.mark.parametrize("message", MESSAGES, ids=lambda m: m.message_id)
def test_cbcl_to_fipa_is_lossless(message: Message) -> None:
    text, losses = message_to_fipa(message)
    assert losses == []
    again, losses = fipa_to_message(text)
    assert (again, losses) == (message, [])


def test_cbcl_body_is_content_in_cbcl_language() -> None:
    text, _ = message_to_fipa(MESSAGES[0])
    fipa = read_fipa(text)
    assert fipa.performative == "request" and fipa.protocol == "fipa-request"
    assert fipa.content == "(request :action (action :name ping))"
    assert fipa.language == Word("CBCL/1.0") and fipa.ontology == Word("request/v1")
    assert fipa.reply_by == "20260101T120000000Z"


def test_notify_travels_as_inform_with_an_x_parameter() -> None:
    fipa = read_fipa(message_to_fipa(MESSAGES[1])[0])
    assert fipa.performative == "inform" and fipa.param("X-CBCL-intent") == Word("NOTIFY")


def test_the_trace_travels_as_an_x_parameter_read_strictly() -> None:
    """The (trace …) field is :X-CBCL-trace (spec/interop.md §1.5); a value that is not a
    W3C traceparent of version 00 is refused, never taken."""
    text, _ = message_to_fipa(MESSAGES[-1])
    assert read_fipa(text).param("X-CBCL-trace") == TRACE
    assert fipa_to_message(text)[0].trace == TRACE
    for bad in (TRACE.upper(), TRACE[:-1]):
        with pytest.raises(ConversionError, match="X-CBCL-trace"):
            fipa_to_message(text.replace(TRACE, bad), lossy=True)


def test_performatives_without_an_intent_of_their_own() -> None:
    text = ("(query-if :sender (agent-identifier :name agent://a) :receiver (set "
            "(agent-identifier :name agent://b)) :content \"(p)\" :language fipa-sl)")
    message, losses = fipa_to_message(text)
    assert (message.intent, losses) == ("QUERY", [])
    assert read_fipa(message_to_fipa(message)[0]).performative == "query-if"
    cbcl_content = ("(query-if :sender (agent-identifier :name agent://a) :receiver (set "
                    "(agent-identifier :name agent://b)) :content \"(p)\" :language CBCL/1.0 "
                    ":ontology p/v1)")
    with pytest.raises(LossyConversionError, match="performative query-if"):
        fipa_to_message(cbcl_content)


def test_aid_uri_mapping() -> None:
    assert str(aid_to_uri(AgentId("agent://x"))[0]) == "agent://x"
    uri, _ = aid_to_uri(AgentId("a b%?&", ("http://h/a&b",)))
    assert str(uri) == "fipa-aid://a%20b%25%3F%26?address=http://h/a%26b"
    assert uri_to_aid(uri) == AgentId("a b%?&", ("http://h/a&b",))
    assert str(aid_to_uri(AgentId("fipa-aid://x"))[0]) == "fipa-aid://fipa-aid://x"
    assert uri_to_aid("fipa-aid://fipa-aid://x") == AgentId("fipa-aid://x")
    with pytest.raises(ConversionError):
        uri_to_aid("fipa-aid://a?b=1")
    with pytest.raises(ConversionError):
        uri_to_aid("fipa-aid://a%2")


def test_reply_by() -> None:
    assert reply_by_to_ms("19700101T000000001Z") == (1, None)
    assert ms_to_reply_by(1) == "19700101T000000001Z"
    ms, loss = reply_by_to_ms("20020314T091400500")
    assert ms == 1016097240500 and loss is not None and "UTC" in loss
    for bad in ("+00000000T000500000", "20020314T091400500B", "20021314T091400500Z"):
        with pytest.raises(ConversionError):
            reply_by_to_ms(bad)
    assert ms_to_reply_by(2**62) is None


def test_relative_reply_by_is_a_loss() -> None:
    text = ("(inform :sender (agent-identifier :name agent://a) :receiver (set "
            "(agent-identifier :name agent://b)) :reply-by +00000000T000500000)")
    with pytest.raises(LossyConversionError, match="relative"):
        fipa_to_message(text)
    assert fipa_to_message(text, lossy=True)[0].reply_by is None


def test_cbcl_content_that_does_not_read_is_refused() -> None:
    text = ("(inform :sender (agent-identifier :name agent://a) :receiver (set "
            "(agent-identifier :name agent://b)) :content \"(a\" :language CBCL/1.0)")
    with pytest.raises(ConversionError, match="not a CBCL value"):
        fipa_to_message(text)


# --------------------------------------------------------------------------- the lexer


def test_strings_backslashes_and_byte_length() -> None:
    m = read_fipa(r'(inform :content "a\"b\\c\d" :reply-with #5"he)lo :x-n +.99E-23)')
    assert m.content == 'a"b\\\\c\\d' and m.reply_with == "he)lo"  # only \" escapes
    assert m.param("X-n") == Number("+.99E-23")
    trailing = FipaMessage("inform", content="ends with \\")
    assert write_fipa(trailing) == '(inform :content #11"ends with \\)'
    assert read_fipa(write_fipa(trailing)) == trailing


def test_case_insensitive_and_words() -> None:
    m = read_fipa("(INFORM :SENDER (Agent-Identifier :NAME x@h:1/JADE) :Protocol FIPA-request "
                  ":reply-by 20010101t000000000z :in-reply-to (a (b \"c\")))")
    assert m.sender == AgentId("x@h:1/JADE") and m.reply_by == DateTime("20010101t000000000z")
    assert m.in_reply_to == (Word("a"), (Word("b"), "c"))


@pytest.mark.parametrize(("text", "column", "words"), [
    ("", 1, "empty input"),
    ("(inform", 1, "unclosed"),
    ("(inform))", 9, "data after"),
    (")", 1, "unbalanced"),
    ("(inform) x", 10, "after the message"),
    ("(hello)", 2, "unknown performative"),
    ("(inform :bogus 1)", 9, "unknown message parameter"),
    ("(inform :content)", 9, "without a value"),
    ("(inform :reply-with 1 :Reply-With 2)", 23, "twice"),
    ("(inform :content \"abc)", 18, "unterminated"),
    ("(inform :content 12abc)", 18, "malformed number"),
    ("(inform :content -abc)", 18, "malformed number"),
    ("(inform :content @a)", 18, "cannot start with '@'"),
    ("(inform :content #9\"ab)", 18, "declares 9 bytes"),
    ("(inform :content #2\"abc)", 23, "followed by"),
    ("(inform :sender (agent-identifier :addresses (sequence)))", 17, "without :name"),
    ("(inform :receiver (sequence))", 20, r"expected \(set"),
    ("(inform :reply-by 2001)", 19, "date-time"),
    ("(inform :content a\u202eb)", 19, "not allowed in a word"),
    ("(inform :content a\x01)", 19, "control character"),
])
def test_errors_have_positions(text: str, column: int, words: str) -> None:
    with pytest.raises(FipaSyntaxError, match=words) as info:
        read_fipa(text)
    assert info.value.kind == "malformed" and info.value.exit_code == 3
    assert info.value.line == 1 and info.value.column == column


def test_invalid_utf8_in_a_string() -> None:
    with pytest.raises(FipaSyntaxError, match="invalid UTF-8") as info:
        read_fipa(b'(inform :content "a\xffb")')
    assert info.value.offset == 19


def test_byte_length_string_may_hold_any_bytes() -> None:
    m = read_fipa(b'(inform :content #3"\xff\x00" )')
    assert m.content == b'\xff\x00"'


# --------------------------------------------------------------------------- limits


def _refused(text: str | bytes, limits: Limits) -> str:
    with pytest.raises(LimitError) as info:
        read_fipa(text, limits=limits)
    return info.value.limit


def test_limit_message_bytes() -> None:
    text = "(inform)"
    assert read_fipa(text, limits=Limits(max_message_bytes=len(text)))
    assert _refused(text, Limits(max_message_bytes=len(text) - 1)) == "max_message_bytes"


def test_limit_depth() -> None:
    text = "(inform :content x :in-reply-to " + "(" * 3 + ")" * 3 + ")"  # depth 4
    assert read_fipa(text, limits=Limits(max_depth=4))
    assert _refused(text, Limits(max_depth=3)) == "max_depth"


def test_limit_items_and_nodes() -> None:
    text = "(inform :in-reply-to (a b c d))"  # 3 and 4 items; 1 + 2 + 1 + 4 = 8 nodes
    assert read_fipa(text, limits=Limits(max_list_items=4, max_nodes=8))
    assert _refused(text, Limits(max_list_items=3)) == "max_list_items"
    assert _refused(text, Limits(max_nodes=7)) == "max_nodes"


def test_limit_strings_quoted_and_byte_length() -> None:
    for text in ('(inform :content "abcd")', '(inform :content #4"abcd)',
                 '(inform :content "ab\\"d")'):
        assert read_fipa(text, limits=Limits(max_string_bytes=4))
        assert _refused(text, Limits(max_string_bytes=3)) == "max_string_bytes"


def test_limit_name_chars() -> None:
    text = "(inform :content abcd)"
    assert read_fipa(text, limits=Limits(max_name_chars=8))  # ":content" is a word too
    assert _refused(text, Limits(max_name_chars=7)) == "max_name_chars"


def test_byte_length_string_never_allocates_more_than_the_input() -> None:
    huge = b'(inform :content #' + b"9" * 40 + b'"ab)'
    assert _refused(huge, Limits()) == "max_string_bytes"
    with pytest.raises(FipaSyntaxError, match="only"):
        read_fipa(b'(inform :content #60000"ab)')


def test_hostile_inputs_are_refused_fast() -> None:
    for text in (b"(" * 100_000, b"(inform :content " + b'"' + b"a" * 500_000,
                 b"(inform :in-reply-to (" + b"a " * 200_000 + b"))",
                 b'(inform :content "' + b'\\"' * 300_000):
        start = time.process_time()
        with pytest.raises(CBCLError):
            read_fipa(text)
        assert time.process_time() - start < 2.0


@given(st.binary(max_size=300))
def test_any_bytes_read_or_raise_cbcl_error(data: bytes) -> None:
    try:
        message = read_fipa(data)
    except CBCLError:
        return
    try:
        text = write_fipa(message)
    except ConversionError:  # bytes that are not UTF-8 have no text form
        return
    assert read_fipa(text) == message


_ALPHABET = st.sampled_from([*'(): "\\#0123456789-+.@aAtTzZ\n',
    "inform", "request", ":sender", ":receiver", ":content", ":reply-by", "set",
    "agent-identifier", ":name", ":addresses", "sequence", ":X-a", "#3\"",
    "20020314T091400500Z", ":language", "CBCL/1.0", ":ontology"])


@given(st.lists(_ALPHABET, max_size=40).map("".join))
def test_near_miss_text_reads_or_raises_cbcl_error(text: str) -> None:
    try:
        message = read_fipa(text)
    except CBCLError:
        return
    assert read_fipa(write_fipa(message)) == message
    with contextlib.suppress(CBCLError):
        fipa_to_message(message, lossy=True)


_WORDS = st.from_regex(r"[a-z][a-z0-9@:/._-]{0,12}", fullmatch=True)
_TEXT = st.text(st.characters(exclude_categories=["Cs"]), max_size=20)
_EXPR = st.recursive(
    st.one_of(_WORDS.map(Word), _TEXT, st.from_regex(r"-?[0-9]{1,5}", fullmatch=True)
              .map(Number)),
    lambda inner: st.lists(inner, max_size=3).map(tuple), max_leaves=6)
_AID = st.builds(AgentId, _TEXT.filter(bool), st.lists(_WORDS, max_size=2).map(tuple))


@given(st.builds(FipaMessage, st.sampled_from(["inform", "request", "query-if", "proxy"]),
                 sender=st.none() | _AID, receivers=st.lists(_AID, max_size=2).map(tuple),
                 content=st.none() | _TEXT, conversation_id=st.none() | _EXPR,
                 reply_with=st.none() | _EXPR,
                 params=st.lists(st.tuples(st.just("X-k"), _EXPR), max_size=1).map(tuple)))
def test_written_messages_read_back(message: FipaMessage) -> None:
    assert read_fipa(write_fipa(message)) == message


# --------------------------------------------------------------------------- cbcl convert


def run(capsys: pytest.CaptureFixture[str], *args: str) -> tuple[int, str, str]:
    code = main(list(args))
    out, err = capsys.readouterr()
    return code, out, err


def test_convert_fipa_to_cbcl_and_back(capsys: pytest.CaptureFixture[str],
                                       tmp_path: Path) -> None:
    code, out, err = run(capsys, "convert", "--from", "fipa", "--to", "cbcl",
                         str(VECTORS / "jade-rma-get-description.acl"))
    assert (code, err) == (0, "") and out.startswith("(CBCL/1.0 (message-id \"fipa-")
    (tmp_path / "m.cbcl").write_text(out)
    code, out, err = run(capsys, "convert", "--from", "cbcl", "--to", "fipa",
                         str(tmp_path / "m.cbcl"))
    assert (code, err) == (0, "")
    assert equivalent(read_fipa(vector("jade-rma-get-description.acl")), read_fipa(out))


def test_convert_refuses_lossy_then_lists_losses(capsys: pytest.CaptureFixture[str]) -> None:
    path = str(VECTORS / "jade-dftest-search.acl")
    code, out, err = run(capsys, "convert", "--from", "fipa", "--to", "cbcl", path)
    assert (code, out) == (5, "")
    assert err.startswith("lossy: ") and ":X-comment" in err and err.count("\n") == 1
    code, out, err = run(capsys, "convert", "--from", "fipa", "--to", "cbcl", "--lossy", path)
    assert code == 0 and out.startswith("(CBCL/1.0")
    assert err == "lost: user-defined parameter :X-comment\n"


def test_convert_errors(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    (tmp_path / "bad.acl").write_text("(inform :content 12abc)")
    code, out, err = run(capsys, "convert", "--from", "fipa", "--to", "cbcl",
                         str(tmp_path / "bad.acl"))
    assert (code, out) == (3, "") and err.startswith("malformed 1:18: ")
    code, _, err = run(capsys, "convert", "--from", "fipa", "--to", "cbcl",
                       str(VECTORS / "jade-testmessages-proxy-number.acl"))
    assert code == 5 and err.startswith("convert: ")
    code, _, err = run(capsys, "convert", "--from", "fipa", "--to", "cbcl",
                       "--max-message-bytes", "10", str(VECTORS / "jade-dftest-search.acl"))
    assert code == 4 and err.startswith("limit: ")
    with pytest.raises(SystemExit) as info:
        main(["convert", "--from", "kqml", "--to", "cbcl"])
    assert info.value.code == 2
    capsys.readouterr()


def test_convert_cbcl_to_a2a_and_back(capsys: pytest.CaptureFixture[str],
                                      tmp_path: Path) -> None:
    pytest.importorskip("cbcl.bridges._a2a")  # written by the A2A work, in the same release
    (tmp_path / "m.cbcl").write_text(MESSAGES[0].canonical())
    code, out, err = run(capsys, "convert", "--from", "cbcl", "--to", "a2a",
                         str(tmp_path / "m.cbcl"))
    assert (code, err) == (0, "")
    (tmp_path / "m.json").write_text(out)
    code, out, err = run(capsys, "convert", "--from", "a2a", "--to", "fipa",
                         str(tmp_path / "m.json"))
    assert (code, err) == (0, "")
    assert fipa_to_message(out)[0] == MESSAGES[0]


def test_errors_are_cbcl_errors() -> None:
    assert issubclass(FipaSyntaxError, MalformedError)
    assert issubclass(LossyConversionError, ConversionError)
    assert ConversionError("x").exit_code == 5
