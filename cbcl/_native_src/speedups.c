/* Optional accelerator of the binary decoder's fast path (cbcl/binary/_codec.py) and of pass 2's
 * walk (cbcl/protocol/_pass2.py).
 *
 * Theory of operation
 * -------------------
 * Functions, each the C twin of a Python function that stays the reference and the
 * fallback when this module is not built, and the rules they judge atoms by:
 *
 *   unpack(data, start)  -> list | None    twin of msgpack's Unpacker over a frame's tokens
 *   build_body(...)      -> value | None   twin of the loop of cbcl.binary._codec._fast_body
 *   check_atom(code, t)  -> bool           the lexical rules build_body applies to atoms
 *   recognise(...)       -> bool           twin of the loop of cbcl.protocol._pass2.recognise_body
 *   envelope(...)        -> Message | None twin of cbcl.protocol._envelope._walk and Message._trusted
 *   make_object(...)     -> object         Message._trusted's construction
 *   frame_envelope(...)  -> tuple | None   the envelope checks of cbcl.binary._codec._fast_message
 *   schema_valid(...)    -> bool | None    the schema check's C twin (cbcl.protocol._schema._explain)
 *   decode_frame(...)    -> Message | None twin of cbcl.binary._codec._fast_frame: a whole frame,
 *                                          header to Message, in one call, with what a
 *                                          decoder keeps for it in a FrameState (a C type
 *                                          with named fields, made by keyword)
 *   accept_document(...) -> Message | None twin of cbcl.protocol._api.accept_document_python: both
 *                                          passes over a document value, by the protocol's
 *                                          acceptance plan (envelope, the walk and the
 *                                          schema's record lookup and fast pass in one call)
 *
 * The twins serve only the happy path. Neither raises for anything in its input: on any doubt
 * (a msgpack type no frame holds, a truncated object, invalid UTF-8, a limit, a token the
 * grammar refuses ...) it returns None and the Python decoder reads the same frame again,
 * carefully, to raise the precise error. Exceptions come only from the interpreter
 * (MemoryError) or from the Python callbacks, which raise nothing for valid tables.
 *
 * unpack decodes the msgpack subset a frame may hold: positive and negative fixint,
 * uint8..uint64, int8..int64, fixstr and str8/16/32 (strict UTF-8). Every read is bounds
 * checked against the buffer; lengths are compared with what is left before use.
 *
 * build_body walks the body's tokens once, building tuples with an explicit stack (no
 * recursion) and stepping the protocol's StackAutomaton (cbcl/grammar/_automaton.py): a node is
 * a dict, a transition a lookup, a missing one a call of automaton.step. The current node
 * is always held by a strong reference: step may flush the automaton, after which only
 * the walk keeps its nodes alive. The recogniser's nodes carry no keyword set's mask: a
 * walk (build_body's, recognise's) keeps the masks of the sets under way (SetFrames) and
 * applies the set operations a transition carries (advance, apply_set_ops). An atom written in full is looked up in its kind's
 * cache of atoms already validated (the interned symbols and keywords, known URIs and
 * decimals). A miss is validated here, by C mirrors of cbcl/core/_vocabulary.py's rules
 * (exported as check_atom for the tests that hold them to the regexes): an invalid atom
 * declines without a Python call, a long decimal (never remembered) is judged and made
 * from its bytes (no str), a URI or short decimal is made here and remembered in the
 * decoder's memo of its kind under its bound (passed with the call), a symbol or keyword
 * interned here (scanner.c's intern tables), and only where those tables are not set up
 * does a name call make_atom, the Python function that makes and remembers it. The atoms
 * a body writes in full are told apart by a C hash table of them (Learned), and asked
 * about in the table's codes only where a filter of those codes' hashes lets one be
 * there (FrameState's code_bloom). In front of those caches, a direct-mapped
 * memo by kind and bytes (atom_memo) finds a symbol, keyword or URI seen before without
 * making its str. The caches and make_atom are the calling decoder's own
 * (cbcl.binary._codec._Memos), passed with each call: the module's state (native.h's
 * SpeedupsState, one per module object) keeps no more than its interned strings, the
 * types it makes (cbcl.core._values' atoms, Decimal: cstack.h's ValueTypes), the atom
 * memo, the member descriptors of the slots it reads (entry.h) and what the entries were
 * given; each function is handed that state (`st`), never a global.
 *
 * The Python side hands its state over as C types with named fields or as the public
 * callables it would call itself: a decoder's FrameState, the registry's protocols
 * through Registry._protocols_by_id(), a slot through its class's member descriptor. The
 * Messages and Signatures it makes are the registered classes over MessageFields and
 * SignatureFields (native.h), their structs filled directly (no __init__ runs: the
 * envelope's checks are the ones it would make).
 */
#include "cstack.h"
#include "entry.h"
#include "intern.h"
#include "native.h"

enum { LPAR = 0, RPAR = 1, INTEGER = 2, DECIMAL = 3, SYMBOL = 4, KEYWORD = 5, URI = 6,
       FIRST_ENTRY = 7 };
static_assert(FIRST_ENTRY == CBCL_TOKEN_CODES, "the state's s_kinds: one per token code");

/* The section's state (native.h's SpeedupsState, st->speedups) holds the interned token
 * classes (s_lpar ... s_kinds[code]) the automaton's transitions are keyed by, the
 * attribute names read, the FrameState type, the atom memo, the attribute tuples
 * new_with_attributes found in grammar order, the _Pairs slot packed_of found, and the entries with what their *_entry functions gave them. Every
 * function that reads it is given the module's state `st`. */

/* ------------------------------------------------------------------------- unpack */

/* One msgpack object of the subset a frame may hold: an int (positive and negative fixint,
 * uint8..uint64, int8..int64) or a str (fixstr, str8/16/32; its UTF-8 is not checked here). */
typedef struct {
    int str;            /* 1: a str, s[0:len]; 0: an int */
    int big;            /* an int above int64 (a uint64 over INT64_MAX) */
    long long integer;  /* the int, if not big */
    unsigned long long unsigned_value; /* the int, if big */
    const char *s;
    Py_ssize_t len;
} Token;

/* Read the object at p[*at] of p[0:n] into *t and move *at past it: 1, or 0 for a type
 * no frame holds (nil, bool, float, bin, ext, array, map, 0xc1) or an object cut short.
 * Every read is bounds-checked; a length is compared with what is left before use. */
static inline int
read_token(const unsigned char *p, Py_ssize_t n, Py_ssize_t *at, Token *t)
{
    Py_ssize_t i = *at;
    if (i >= n)
        return 0;
    unsigned char b = p[i++];
    t->str = 0;
    t->big = 0;
    if (b <= 0x7f) {
        t->integer = b;
    } else if (b >= 0xe0) {
        t->integer = (long long)b - 256;
    } else if (b >= 0xa0 && b <= 0xbf) {
        t->str = 1;
        t->len = b & 0x1f;
    } else {
        Py_ssize_t need;
        switch (b) {
        case 0xcc: case 0xd0: case 0xd9: need = 1; break;
        case 0xcd: case 0xd1: case 0xda: need = 2; break;
        case 0xce: case 0xd2: case 0xdb: need = 4; break;
        case 0xcf: case 0xd3: need = 8; break;
        default: return 0;
        }
        if (need > n - i)
            return 0;
        unsigned long long u = 0;
        for (Py_ssize_t k = 0; k < need; k++)
            u = (u << 8) | p[i + k];
        i += need;
        switch (b) {
        case 0xcc: case 0xcd: case 0xce: case 0xcf:
            if (u > (unsigned long long)LLONG_MAX) {
                t->big = 1;
                t->unsigned_value = u;
            } else
                t->integer = (long long)u;
            break;
        case 0xd0: t->integer = (signed char)u; break;
        case 0xd1: t->integer = (short)u; break;
        case 0xd2: t->integer = (int)(unsigned int)u; break;
        case 0xd3: t->integer = (long long)u; break;
        default: /* str8, str16, str32 */
            if (u > (unsigned long long)PY_SSIZE_T_MAX)
                return 0;
            t->str = 1;
            t->len = (Py_ssize_t)u;
        }
    }
    if (t->str) {
        if (t->len > n - i)
            return 0;
        t->s = (const char *)p + i;
        i += t->len;
    }
    *at = i;
    return 1;
}

/* The str of a str token: a new reference, Py_None for invalid UTF-8, NULL with an
 * exception. */
static PyObject *
token_str(const Token *t)
{
    /* ASCII (nearly every name and most strings a frame holds): made and copied directly,
     * without the decoder's call and its checks (the one-character strs, which CPython
     * shares, and anything else are left to it). The same str either way. */
    if (t->len > 1) {
        const unsigned char *s = (const unsigned char *)t->s;
        Py_ssize_t k = 0;
        uint64_t high = 0;
        for (; k + 8 <= t->len; k += 8) {
            uint64_t word;
            memcpy(&word, s + k, 8);
            high |= word;
        }
        for (; k < t->len; k++)
            high |= s[k];
        if (!(high & UINT64_C(0x8080808080808080))) {
            PyObject *ascii = PyUnicode_New(t->len, 127);
            if (ascii != NULL)
                memcpy(PyUnicode_1BYTE_DATA(ascii), s, (size_t)t->len);
            return ascii;
        }
    }
    PyObject *text = PyUnicode_DecodeUTF8(t->s, t->len, "strict");
    if (text == NULL && PyErr_ExceptionMatches(PyExc_UnicodeDecodeError)) {
        PyErr_Clear();
        Py_RETURN_NONE;
    }
    return text;
}

/* unpack(data, start) -> list | None: the objects from data[start:], or None for anything
 * outside the subset a frame holds, cut short or of invalid UTF-8. */
static PyObject *
unpack(PyObject *Py_UNUSED(self), PyObject *args)
{
    Py_buffer view;
    Py_ssize_t start;
    if (!PyArg_ParseTuple(args, "y*n", &view, &start))
        return NULL;
    const unsigned char *p = (const unsigned char *)view.buf;
    Py_ssize_t n = view.len, i = start;
    PyObject *result = NULL;
    PyObject *out = PyList_New(0);
    if (out == NULL)
        goto done;
    if (start < 0 || start > n)
        goto bail;
    while (i < n) {
        Token t;
        PyObject *obj;
        if (!read_token(p, n, &i, &t))
            goto bail;
        if (t.str) {
            obj = token_str(&t);
            if (obj == Py_None) {
                Py_DECREF(obj);
                goto bail;
            }
        } else if (t.big) {
            obj = PyLong_FromUnsignedLongLong(t.unsigned_value);
        } else {
            obj = PyLong_FromLongLong(t.integer);
        }
        if (obj == NULL)
            goto done;
        if (PyList_Append(out, obj) < 0) {
            Py_DECREF(obj);
            goto done;
        }
        Py_DECREF(obj);
    }
    result = out;
    Py_INCREF(result);
    goto done;
bail:
    result = Py_None;
    Py_INCREF(result);
done:
    Py_XDECREF(out);
    PyBuffer_Release(&view);
    return result;
}

/* ------------------------------------------------------------------------- build_body */

/* The result of feeding `cls` to `node` (a new reference), or NULL with an exception. */
static inline PyObject *
transition(PyObject *node, PyObject *cls, PyObject *step)
{
    PyObject *found = PyDict_GetItemWithError(node, cls);
    if (found != NULL) {
        Py_INCREF(found);
        return found;
    }
    if (PyErr_Occurred())
        return NULL;
    return PyObject_CallFunctionObjArgs(step, node, cls, NULL);
}

/* The masks of the keyword sets under way in one walk, innermost last: the walker's side of
 * a StackAutomaton made with walker_masks (cbcl/grammar/_automaton.py), whose nodes carry
 * no masks and whose transitions that pass a set's state carry its set operations. */
typedef struct {
    unsigned long long *masks;
    Py_ssize_t depth, capacity;
    unsigned long long inline_masks[16];
} SetFrames;

static inline void
set_frames_init(SetFrames *f)
{
    f->masks = f->inline_masks;
    f->depth = 0;
    f->capacity = 16;
}

static inline void
set_frames_free(SetFrames *f)
{
    if (f->masks != f->inline_masks)
        PyMem_Free(f->masks);
    f->masks = f->inline_masks;
    f->depth = 0;
}

enum { SET_OPEN = 0, SET_MEMBER = 1, SET_CLOSE = 2 };

/* Apply one set operation (cbcl.grammar._automaton.set_op) to `f`: 1, 0 where the kernel
 * refuses (a member given twice, a set ended without a required member), -1 with an
 * exception. */
static inline int
apply_set_op(SetFrames *f, unsigned long long op)
{
    unsigned long long mask = op >> 2;
    int kind = (int)(op & 3);
    if (kind == SET_OPEN) {
        if (f->depth == f->capacity) {
            Py_ssize_t more = 2 * f->capacity;
            unsigned long long *grown = f->masks == f->inline_masks ?
                PyMem_Malloc((size_t)more * sizeof *grown) :
                PyMem_Realloc(f->masks, (size_t)more * sizeof *grown);
            if (grown == NULL) {
                PyErr_NoMemory();
                return -1;
            }
            if (f->masks == f->inline_masks)
                memcpy(grown, f->inline_masks, sizeof f->inline_masks);
            f->masks = grown;
            f->capacity = more;
        }
        f->masks[f->depth++] = 0;
        return 1;
    }
    if (f->depth == 0) {
        PyErr_SetString(PyExc_ValueError, "a keyword set's operation with no set under way");
        return -1;
    }
    if (kind == SET_MEMBER) {
        if (f->masks[f->depth - 1] & mask)
            return 0; /* given twice */
        f->masks[f->depth - 1] |= mask;
    } else if (mask & ~f->masks[--f->depth]) {
        return 0; /* the set ends without a required member */
    }
    return 1;
}

/* Apply a transition's set operations (a tuple of ints, cbcl.grammar._automaton.set_op) to
 * `f`, as cbcl.grammar._automaton.apply_set_ops does: 1, 0 where the kernel refuses (a member
 * given twice, a set ended without a required member), -1 with an exception. */
static int
apply_set_ops(SetFrames *f, PyObject *ops)
{
    if (!PyTuple_CheckExact(ops)) {
        PyErr_SetString(PyExc_TypeError, "a transition's set operations must be a tuple");
        return -1;
    }
    for (Py_ssize_t k = 0; k < PyTuple_GET_SIZE(ops); k++) {
        unsigned long long op = PyLong_AsUnsignedLongLong(PyTuple_GET_ITEM(ops, k));
        if (op == (unsigned long long)-1 && PyErr_Occurred())
            return -1;
        int ok = apply_set_op(f, op);
        if (ok <= 0)
            return ok;
    }
    return 1;
}

/* Replace the strong reference *node by the node `cls` leads to: 1 on success, 0 if the
 * grammar refuses (*node is left as it was), -1 with an exception. `before` (or NULL):
 * where a transition with set operations copies the frames before it applies them. For LPAR, *whole receives the flag. A transition
 * with set operations ((next, ops); (next, whole, ops) for LPAR) applies them to `frames`. */
static int set_frames_copy(SetFrames *to, const SetFrames *from);

static inline int
advance_noting(PyObject **node, PyObject *cls, PyObject *step, PyObject *refused, int *whole,
               SetFrames *frames, SetFrames *before)
{
    PyObject *next = transition(*node, cls, step);
    if (next == NULL)
        return -1;
    PyObject *ops = NULL;
    if (whole != NULL) {
        if (!PyTuple_CheckExact(next) ||
                (PyTuple_GET_SIZE(next) != 2 && PyTuple_GET_SIZE(next) != 3)) {
            Py_DECREF(next);
            PyErr_SetString(PyExc_TypeError, "an LPAR transition must be (node, whole[, ops])");
            return -1;
        }
        *whole = PyTuple_GET_ITEM(next, 1) == Py_True;
        if (PyTuple_GET_SIZE(next) == 3)
            ops = PyTuple_GET_ITEM(next, 2);
    } else if (PyTuple_CheckExact(next)) {
        if (PyTuple_GET_SIZE(next) != 2) {
            Py_DECREF(next);
            PyErr_SetString(PyExc_TypeError, "a transition with set operations must be "
                                             "(node, ops)");
            return -1;
        }
        ops = PyTuple_GET_ITEM(next, 1);
    }
    if (whole != NULL || ops != NULL) {
        PyObject *target = Py_NewRef(PyTuple_GET_ITEM(next, 0));
        if (ops != NULL && target != refused) {
            if (before != NULL && set_frames_copy(before, frames) < 0) {
                Py_DECREF(target);
                Py_DECREF(next);
                return -1;
            }
            int ok = apply_set_ops(frames, ops);
            if (ok <= 0) {
                Py_DECREF(target);
                Py_DECREF(next);
                return ok;
            }
        }
        Py_DECREF(next);
        next = target;
    }
    if (next == refused) { /* (*node stays the node the token was fed to) */
        Py_DECREF(next);
        return 0;
    }
    Py_DECREF(*node);
    *node = next;
    return 1;
}

/* advance, the frames before the transition not kept. */
static inline int
advance(PyObject **node, PyObject *cls, PyObject *step, PyObject *refused, int *whole,
        SetFrames *frames)
{
    return advance_noting(node, cls, step, refused, whole, frames, NULL);
}

/* Make `to` (initialised) a copy of `from`: 0, or -1 with MemoryError. */
static int
set_frames_copy(SetFrames *to, const SetFrames *from)
{
    if (from->depth > to->capacity) {
        unsigned long long *grown = PyMem_Malloc((size_t)from->capacity * sizeof *grown);
        if (grown == NULL) {
            PyErr_NoMemory();
            return -1;
        }
        if (to->masks != to->inline_masks)
            PyMem_Free(to->masks);
        to->masks = grown;
        to->capacity = from->capacity;
    }
    memcpy(to->masks, from->masks, (size_t)from->depth * sizeof *from->masks);
    to->depth = from->depth;
    return 0;
}

/* Whether `$END` completes the walk at `node`: 1, 0, -1 with an exception (a transition
 * with set operations applies them to `frames` first). */
static int
ends(PyObject *node, PyObject *end_class, PyObject *step, PyObject *accept, SetFrames *frames)
{
    PyObject *end = transition(node, end_class, step);
    if (end == NULL)
        return -1;
    int ok;
    if (PyTuple_CheckExact(end)) {
        ok = PyTuple_GET_SIZE(end) == 2 && PyTuple_GET_ITEM(end, 0) == accept ?
            apply_set_ops(frames, PyTuple_GET_ITEM(end, 1)) : 0;
    } else {
        ok = end == accept; /* compared by identity only */
    }
    Py_DECREF(end);
    return ok;
}

/* The lexical rules of cbcl/core/_vocabulary.py, mirrored exactly (tests/test_decoder_atoms.py
 * holds each to its regex over every code point of the BMP and on adversarial texts).
 * Python's `re` on str without IGNORECASE: [A-Za-z] and [0-9] are ASCII only. */

/* NAME_START: [A-Za-z+\-*\/<>=!?_.] */
static int
name_start(Py_UCS4 c)
{
    if ((c >= 'A' && c <= 'Z') || (c >= 'a' && c <= 'z'))
        return 1;
    switch (c) {
    case '+': case '-': case '*': case '/': case '<': case '>': case '=': case '!':
    case '?': case '_': case '.':
        return 1;
    default:
        return 0;
    }
}

/* NAME_REST: NAME_START, [0-9] and @ % & */
static int
name_rest(Py_UCS4 c)
{
    return name_start(c) || (c >= '0' && c <= '9') || c == '@' || c == '%' || c == '&';
}

/* NAME_RE (keyword) or SYMBOL_RE (symbol: a NAME not matching NUMBERLIKE, [+\-]?\.?[0-9],
 * at its start). */
static int
valid_name(PyObject *text, int symbol)
{
    Py_ssize_t n = PyUnicode_GET_LENGTH(text), i;
    int kind = PyUnicode_KIND(text);
    const void *data = PyUnicode_DATA(text);
    if (n == 0 || !name_start(PyUnicode_READ(kind, data, 0)))
        return 0;
    for (i = 1; i < n; i++)
        if (!name_rest(PyUnicode_READ(kind, data, i)))
            return 0;
    if (symbol) {
        Py_UCS4 c;
        i = 0;
        c = PyUnicode_READ(kind, data, 0);
        if (c == '+' || c == '-')
            c = ++i < n ? PyUnicode_READ(kind, data, i) : 0;
        if (c == '.')
            c = ++i < n ? PyUnicode_READ(kind, data, i) : 0;
        if (c >= '0' && c <= '9')
            return 0; /* starts like a number */
    }
    return 1;
}

#define DECIMAL_MEMO_CHARS 4 /* cbcl.binary._codec._DECIMAL_MEMO_CHARS: shorter ones are memoized */

/* DECIMAL_RE, of at most MAX_DECIMAL_CHARS characters: is_decimal (cbcl/_native_src/cstack.h) over the
 * str's bytes (a decimal is ASCII). */
static int
valid_decimal(PyObject *text)
{
    Py_ssize_t n = PyUnicode_GET_LENGTH(text);
    return n <= MAX_DECIMAL_CHARS && PyUnicode_IS_ASCII(text) &&
           is_decimal((const unsigned char *)PyUnicode_DATA(text), 0, n);
}

/* Whether a URI's rest may hold `c`: not in cbcl.core._vocabulary.URI_REST_EXCLUDES (space and
 * controls, delimiters, bidirectional controls, INVISIBLE). */
static int
uri_rest(Py_UCS4 c)
{
    if (c <= 0x20 || (c >= 0x7f && c <= 0x9f))
        return 0;
    switch (c) {
    case '(': case ')': case '"': case ';':
    case 0x00a0: case 0x061c: case 0x1680: case 0x3000: case 0xfeff:
        return 0;
    default:
        break;
    }
    if ((c >= 0x2066 && c <= 0x2069) || (c >= 0x2000 && c <= 0x200f) ||
            (c >= 0x2028 && c <= 0x202f) || (c >= 0x205f && c <= 0x2064))
        return 0;
    return 1;
}

/* URI_RE: [a-z][a-z0-9+.\-]*+://[^URI_REST_EXCLUDES]++ (the scheme's class holds no ':',
 * so its possessive run ends where "://" must start). */
static int
valid_uri(PyObject *text)
{
    Py_ssize_t n = PyUnicode_GET_LENGTH(text), i;
    int kind = PyUnicode_KIND(text);
    const void *data = PyUnicode_DATA(text);
    Py_UCS4 c;
    if (n == 0 || !((c = PyUnicode_READ(kind, data, 0)) >= 'a' && c <= 'z'))
        return 0;
    for (i = 1; i < n; i++) {
        c = PyUnicode_READ(kind, data, i);
        if (!((c >= 'a' && c <= 'z') || (c >= '0' && c <= '9') || c == '+' || c == '.' ||
              c == '-'))
            break;
    }
    if (n - i < 4 || PyUnicode_READ(kind, data, i) != ':' ||
            PyUnicode_READ(kind, data, i + 1) != '/' || PyUnicode_READ(kind, data, i + 2) != '/')
        return 0;
    for (i += 3; i < n; i++)
        if (!uri_rest(PyUnicode_READ(kind, data, i)))
            return 0;
    return 1;
}

/* Whether `text` (an exact str) is valid as an atom of kind `code` (DECIMAL .. URI). */
static int
valid_atom(long code, PyObject *text)
{
    switch (code) {
    case DECIMAL: return valid_decimal(text);
    case SYMBOL: return valid_name(text, 1);
    case KEYWORD: return valid_name(text, 0);
    default: return valid_uri(text);
    }
}


#define MEMO_CHARS 128 /* cbcl.binary._codec.MEMO_CHARS: the longest text a decoder remembers */

/* The URI `text` (valid: checked by the caller), made here and remembered in the
 * decoder's memo `uris` as cbcl.binary._codec._Memos._remember_uri remembers it: texts of at most
 * MEMO_CHARS characters, the memo emptied when it holds `entries`. A new reference, or
 * NULL with an exception. */
static PyObject *
remember_uri(const ValueTypes *vt, PyObject *uris, PyObject *text, Py_ssize_t entries)
{
    /* str.__new__(URI, text), as _remember_uri makes it: URI() would match the regex
     * the text has just passed in C (untracked: it refers to its type only) */
    PyObject *uri = cbcl_new_atom(vt, 2, text);
    if (uri == NULL || PyUnicode_GET_LENGTH(text) > MEMO_CHARS)
        return uri;
    if (PyDict_GET_SIZE(uris) >= entries)
        PyDict_Clear(uris);
    if (PyDict_SetItem(uris, text, uri) < 0) {
        Py_DECREF(uri);
        return NULL;
    }
    return uri;
}

/* The decimal `text` (valid: checked by the caller), made here and, if of at most
 * DECIMAL_MEMO_CHARS characters, remembered in the decoder's memo `decimals` as
 * cbcl.binary._codec._Memos._remember_decimal remembers it (the memo emptied when it holds
 * `entries`). A new reference, or NULL with an exception. */
static PyObject *
remember_decimal(const ValueTypes *vt, PyObject *decimals, PyObject *text,
                 Py_ssize_t entries)
{
    PyObject *value = decimal_of(vt, PyUnicode_DATA(text), PyUnicode_GET_LENGTH(text), text);
    if (value == NULL || PyUnicode_GET_LENGTH(text) > DECIMAL_MEMO_CHARS)
        return value;
    if (PyDict_GET_SIZE(decimals) >= entries)
        PyDict_Clear(decimals);
    if (PyDict_SetItem(decimals, text, value) < 0) {
        Py_DECREF(value);
        return NULL;
    }
    return value;
}

/* The decoder's memo of atoms written in full, by kind and bytes, in front of the
 * decoders' own (MemoSlot, native.h; st->speedups.atom_memo, in the module's state, as
 * cbcl/_native_src/scanner.c keeps one in front of the text reader's cache):
 * direct-mapped, ATOM_SLOTS slots of symbols, keywords and URIs of at most ATOM_CHARS
 * ASCII characters. A pure memo (spec/cbcl-1.0.md, "Process-wide memos"): the atom a
 * kind and text denote does not depend on when it was read; no limit is stored (the name
 * limit is checked before the lookup). */
#define ATOM_SLOTS CBCL_MEMO_SLOTS
#define ATOM_CHARS 64

/* The slot of kind `code` and text s[0:len], or NULL for a text the memo does not hold
 * (longer than ATOM_CHARS, or not ASCII). */
static MemoSlot *
atom_slot(NativeState *st, long code, const char *s, Py_ssize_t len)
{
    int ascii;
    if (len > ATOM_CHARS)
        return NULL;
    size_t h = memo_hash((const unsigned char *)s, len, code, &ascii);
    return ascii ? &st->speedups.atom_memo[h & (ATOM_SLOTS - 1)] : NULL;
}

/* The atom written in full as kind `code` (DECIMAL .. URI) and `text`: a new reference,
 * Py_None if it is invalid or over the name limit, NULL with an exception. A text found in
 * the kind's cache of atoms already validated is not validated again; a miss is validated
 * and made here: a URI or decimal remembered in its memo (remember_uri, remember_decimal,
 * at most `entries`), a symbol or keyword interned (cbcl_intern_name); only where the
 * intern tables are not set up does a name call make_atom, which makes and remembers it.
 * (build_body_of makes a decimal longer than DECIMAL_MEMO_CHARS itself, without a str.) */
static PyObject *
atom_of(NativeState *st, long code, PyObject *text, PyObject *caches, PyObject *make_atom,
        Py_ssize_t max_name, Py_ssize_t entries)
{
    if (!PyUnicode_CheckExact(text))
        Py_RETURN_NONE;
    if ((code == SYMBOL || code == KEYWORD) && PyUnicode_GET_LENGTH(text) > max_name)
        Py_RETURN_NONE;
    PyObject *cache = PyTuple_GET_ITEM(caches, code);
    PyObject *value = PyDict_GetItemWithError(cache, text);
    if (value != NULL) {
        Py_INCREF(value);
        return value;
    }
    if (PyErr_Occurred())
        return NULL;
    if (!valid_atom(code, text))
        Py_RETURN_NONE;
    if (code == DECIMAL)
        return remember_decimal(&st->values, cache, text, entries);
    if (code == URI)
        return remember_uri(&st->values, PyTuple_GET_ITEM(caches, URI), text, entries);
    if (code == SYMBOL || code == KEYWORD) { /* interned here, without a call into Python */
        /* (where the cache just looked in is the intern table, not looked up again) */
        InternTables *t = &st->scanner.intern;
        PyObject *name = cache == (code == KEYWORD ? t->keywords : t->symbols) ?
            cbcl_intern_new_name(st, code == KEYWORD, text) :
            cbcl_intern_name(st, code == KEYWORD, text);
        if (name != Py_None)
            return name;
        Py_DECREF(name); /* (the tables are not set up: make_atom interns) */
    }
    return PyObject_CallFunction(make_atom, "lO", code, text);
}

/* check_atom(code, text) -> bool: whether the lexical rule of kind `code` (DECIMAL,
 * SYMBOL, KEYWORD or URI) admits `text` (an exact str), as build_body judges a miss. */
static PyObject *
check_atom(PyObject *Py_UNUSED(self), PyObject *args)
{
    long code;
    PyObject *text;
    if (!PyArg_ParseTuple(args, "lU", &code, &text))
        return NULL;
    if (code < DECIMAL || code > URI) {
        PyErr_SetString(PyExc_ValueError, "code must be DECIMAL, SYMBOL, KEYWORD or URI");
        return NULL;
    }
    return PyBool_FromLong(PyUnicode_CheckExact(text) && valid_atom(code, text));
}

/* build_body(data, offset, entries, codes, caches, make_atom, start, step, max_depth,
 * max_items, max_string, max_name, budget, refused, accept, memo_entries) -> value | None:
 * the body
 * whose tokens are data[offset:], to the frame's end, read straight from the msgpack bytes
 * (the twin of cbcl.binary._codec._fast_body_loop over the same bytes' tokens). `entries` holds
 * (atom, class) for each static code from FIRST_ENTRY on; an atom written in full gets the
 * next code after them (it is "learned"). At most `budget` nodes (lists and atoms). */
/* The atoms a body writes in full, in the order they get their codes (a code past the
 * table's is the index of one here): their classes borrowed from the state's s_kinds, the
 * atoms owned, with their hashes. Told apart by an open-addressing table of positions
 * (`slots`, position + 1, 0 empty; at most half full), keyed by the atoms' str hashes (a
 * name's is cached: it was interned) and compared as same_atom does: no Python set. The
 * first LEARNED_INLINE atoms and their 2 * LEARNED_INLINE slots are inline; past that,
 * both are on the heap, doubled as they fill. */
#define LEARNED_INLINE 64

typedef struct {
    PyObject **atoms, **classes; /* inline, or on the heap past LEARNED_INLINE */
    Py_hash_t *hashes;
    uint32_t *slots;             /* 2 * capacity of them, a power of two */
    Py_ssize_t count, capacity;
    PyObject *inline_atoms[LEARNED_INLINE], *inline_classes[LEARNED_INLINE];
    Py_hash_t inline_hashes[LEARNED_INLINE];
    uint32_t inline_slots[2 * LEARNED_INLINE];
} Learned;

static inline void
learned_init(Learned *l)
{
    l->atoms = l->inline_atoms;
    l->classes = l->inline_classes;
    l->hashes = l->inline_hashes;
    l->slots = l->inline_slots;
    l->count = 0;
    l->capacity = LEARNED_INLINE;
    memset(l->inline_slots, 0, sizeof l->inline_slots);
}

/* Whether two learned atoms are equal as cbcl.core._values._Atom has them: one exact type and
 * one text (canonical strs: equal texts have one kind). */
static inline int
same_atom(PyObject *a, PyObject *b)
{
    if (a == b)
        return 1;
    if (Py_TYPE(a) != Py_TYPE(b) || PyUnicode_GET_LENGTH(a) != PyUnicode_GET_LENGTH(b) ||
            PyUnicode_KIND(a) != PyUnicode_KIND(b))
        return 0;
    return memcmp(PyUnicode_DATA(a), PyUnicode_DATA(b),
                  (size_t)PyUnicode_GET_LENGTH(a) * PyUnicode_KIND(a)) == 0;
}

/* Whether `atom` (a Symbol, Keyword or URI, hash h) was learned already: 1 or 0. */
static int
learned_has(const Learned *l, PyObject *atom, Py_hash_t h)
{
    size_t mask = (size_t)(2 * l->capacity - 1), i = (size_t)h & mask, perturb = (size_t)h;
    for (uint32_t at; (at = l->slots[i]) != 0; i = (i * 5 + 1 + (perturb >>= 5)) & mask)
        if (l->hashes[at - 1] == h && same_atom(l->atoms[at - 1], atom))
            return 1;
    return 0;
}

/* Put position k (of hash h) in the slots (the table has room). */
static inline void
learned_place(Learned *l, Py_ssize_t k, Py_hash_t h)
{
    size_t mask = (size_t)(2 * l->capacity - 1), i = (size_t)h & mask, perturb = (size_t)h;
    while (l->slots[i] != 0)
        i = (i * 5 + 1 + (perturb >>= 5)) & mask;
    l->slots[i] = (uint32_t)(k + 1);
}

/* Learn `atom` (hash h; a new reference is kept) of class `cls` (borrowed): 0, or -1 with
 * an exception. */
static int
learned_add(Learned *l, PyObject *atom, Py_hash_t h, PyObject *cls)
{
    if (l->count == l->capacity) {
        if (l->capacity > (Py_ssize_t)(UINT32_MAX / 4)) {
            PyErr_NoMemory();
            return -1;
        }
        Py_ssize_t more = 2 * l->capacity;
        PyObject **atoms = PyMem_Malloc((size_t)more * sizeof(PyObject *));
        PyObject **classes = PyMem_Malloc((size_t)more * sizeof(PyObject *));
        Py_hash_t *hashes = PyMem_Malloc((size_t)more * sizeof(Py_hash_t));
        uint32_t *slots = PyMem_Calloc((size_t)(2 * more), sizeof(uint32_t));
        if (atoms == NULL || classes == NULL || hashes == NULL || slots == NULL) {
            PyMem_Free(atoms);
            PyMem_Free(classes);
            PyMem_Free(hashes);
            PyMem_Free(slots);
            PyErr_NoMemory();
            return -1;
        }
        memcpy(atoms, l->atoms, (size_t)l->count * sizeof(PyObject *));
        memcpy(classes, l->classes, (size_t)l->count * sizeof(PyObject *));
        memcpy(hashes, l->hashes, (size_t)l->count * sizeof(Py_hash_t));
        if (l->atoms != l->inline_atoms) {
            PyMem_Free(l->atoms);
            PyMem_Free(l->classes);
            PyMem_Free(l->hashes);
            PyMem_Free(l->slots);
        }
        l->atoms = atoms;
        l->classes = classes;
        l->hashes = hashes;
        l->slots = slots;
        l->capacity = more;
        for (Py_ssize_t k = 0; k < l->count; k++)
            learned_place(l, k, l->hashes[k]);
    }
    l->atoms[l->count] = Py_NewRef(atom);
    l->classes[l->count] = cls;
    l->hashes[l->count] = h;
    learned_place(l, l->count, h);
    l->count++;
    return 0;
}

static void
learned_free(Learned *l)
{
    for (Py_ssize_t k = 0; k < l->count; k++)
        Py_DECREF(l->atoms[k]);
    if (l->atoms != l->inline_atoms) {
        PyMem_Free(l->atoms);
        PyMem_Free(l->classes);
        PyMem_Free(l->hashes);
        PyMem_Free(l->slots);
    }
    l->atoms = l->classes = NULL;
    l->hashes = NULL;
    l->slots = NULL;
    l->count = l->capacity = 0;
}

/* Where build_body_of's walk met the first token the grammar refuses (decode_frame's
 * report, for cbcl.binary._codec._frame_refusal to word the error from, the walk's state
 * there being the explanation's start): what it is (cbcl.protocol._pass2's ITEM, CLOSE or
 * END), its path in the body (the index of each list's element on the way down), the
 * recogniser node it was fed to and its class, the keyword sets' masks then (innermost
 * last) and the byte offset of its first token (the frame's length for END). */
enum { BR_NONE = 0, BR_ITEM = 1, BR_CLOSE = 2, BR_END = 3 };

typedef struct {
    int kind;
    PyObject *node, *cls, *path, *frames; /* strong references once kind is set */
    Py_ssize_t at;
} BodyRefusal;

#define BODY_REFUSAL_INIT {BR_NONE, NULL, NULL, NULL, NULL, 0}

static void
body_refusal_free(BodyRefusal *why)
{
    Py_CLEAR(why->node);
    Py_CLEAR(why->cls);
    Py_CLEAR(why->path);
    Py_CLEAR(why->frames);
    why->kind = BR_NONE;
}

/* Record a refusal in `why`: the path is the item counts of the first `levels` lists of
 * `stack` (each list's count is the index of the element under way in it). 0, or -1 with
 * an exception. */
static int
note_refusal(BodyRefusal *why, int kind, PyObject *node, PyObject *cls, const Stack *stack,
             Py_ssize_t levels, const SetFrames *frames, Py_ssize_t at)
{
    PyObject *path = PyTuple_New(levels);
    PyObject *masks = PyTuple_New(frames->depth);
    if (path == NULL || masks == NULL)
        goto fail;
    for (Py_ssize_t k = 0; k < levels; k++) {
        Py_ssize_t end = k + 1 < stack->depth ? stack->opens[k + 1] : stack->size;
        PyObject *index = PyLong_FromSsize_t(end - stack->opens[k]);
        if (index == NULL)
            goto fail;
        PyTuple_SET_ITEM(path, k, index);
    }
    for (Py_ssize_t k = 0; k < frames->depth; k++) {
        PyObject *mask = PyLong_FromUnsignedLongLong(frames->masks[k]);
        if (mask == NULL)
            goto fail;
        PyTuple_SET_ITEM(masks, k, mask);
    }
    why->kind = kind;
    why->node = Py_NewRef(node);
    why->cls = Py_NewRef(cls);
    why->path = path;
    why->frames = masks;
    why->at = at;
    return 0;
fail:
    Py_XDECREF(path);
    Py_XDECREF(masks);
    return -1;
}

/* build_body_of's walk of one token from `node` (a strong reference, replaced), as
 * advance: where `why` is given, a refusal is noted there and the walk stops (*node is
 * cleared: the rest of the body is built without the grammar) and 1 is returned; else 0
 * for a refusal. `before` is the walk's scratch copy of the frames. -1 with an
 * exception. */
static inline int
walk_noting(PyObject **node, PyObject *cls, PyObject *step, PyObject *refused, int *whole,
            SetFrames *sets, SetFrames *before, BodyRefusal *why, int kind,
            const Stack *stack, Py_ssize_t levels, Py_ssize_t at)
{
    if (why == NULL)
        return advance(node, cls, step, refused, whole, sets);
    before->depth = -1; /* (a copy is made only where the transition has set operations) */
    int ok = advance_noting(node, cls, step, refused, whole, sets, before);
    if (ok == 0) {
        ok = note_refusal(why, kind, *node, cls, stack, levels,
                          before->depth >= 0 ? before : sets, at) < 0 ? -1 : 1;
        Py_CLEAR(*node);
    }
    return ok;
}

static PyObject *
build_body_of(NativeState *st, const unsigned char *p, Py_ssize_t n, Py_ssize_t offset,
              PyObject *entries, PyObject *codes, PyObject *caches, PyObject *make_atom,
              PyObject *start, PyObject *step, Py_ssize_t max_depth, Py_ssize_t max_items,
              Py_ssize_t max_string, Py_ssize_t max_name, Py_ssize_t budget,
              PyObject *refused, PyObject *accept, Py_ssize_t memo_entries,
              BodyRefusal *why, const uint64_t *code_bloom)
{
    PyObject *result = NULL;
    PyObject *node = NULL; /* strong reference, or NULL when the grammar is not run */
    Learned learned; /* the atoms written in full, in order */
    learned_init(&learned);
    PyObject *value = NULL;   /* owned */
    Stack stack = STACK_INIT; /* the lists under way (cbcl/_native_src/cstack.h) */
    Py_ssize_t whole_at = 0;  /* the depth of a list taken as a whole value, or 0 */
    SetFrames sets;           /* the keyword sets' masks (advance) */
    set_frames_init(&sets);
    SetFrames before;         /* with `why`: the masks before a transition (walk_noting) */
    set_frames_init(&before);
    Py_ssize_t nodes = 0;
    Py_ssize_t i = offset;
    Py_ssize_t static_count = PyTuple_GET_SIZE(entries);
    long long next_code = FIRST_ENTRY + (long long)static_count;
    int ok, gc_paused = 0;
    if (PyTuple_GET_SIZE(caches) != FIRST_ENTRY) {
        PyErr_SetString(PyExc_ValueError, "caches must hold one entry per token code");
        goto error;
    }
    for (int k = DECIMAL; k <= URI; k++) {
        if (!PyDict_CheckExact(PyTuple_GET_ITEM(caches, k))) {
            PyErr_SetString(PyExc_TypeError, "each kind's cache must be a dict");
            goto error;
        }
    }
    if (start != Py_None) {
        if (!PyDict_CheckExact(start)) {
            PyErr_SetString(PyExc_TypeError, "the automaton's start must be a dict");
            goto error;
        }
        node = start;
        Py_INCREF(node);
    }
    if (offset < 0 || offset > n)
        goto bail;
    /* No collection while the body is read, as in the text reader (scanner.c,
     * cbcl_read_value_of): its atoms and tuples are untracked as they are made, yet each
     * counts toward the next collection; put off to the first allocation after. */
    gc_paused = PyGC_Disable();
    while (i < n) {
        Token t;
        PyObject *cls;
        Py_ssize_t token_at = i; /* (where a refusal points) */
        if (!read_token(p, n, &i, &t))
            goto bail;
        if (t.str) {
            if (t.len > max_string)
                goto bail; /* (its UTF-8 is its bytes) */
            value = token_str(&t);
            if (value == NULL)
                goto error;
            if (value == Py_None)
                goto bail;
            cls = st->speedups.s_string;
        } else {
            if (t.big || t.integer < 0)
                goto bail;
            long long code = t.integer;
            if (code >= FIRST_ENTRY && code < next_code) {
                PyObject *entry = PyTuple_GET_ITEM(entries, (Py_ssize_t)(code - FIRST_ENTRY));
                if (!PyTuple_CheckExact(entry) || PyTuple_GET_SIZE(entry) != 2) {
                    PyErr_SetString(PyExc_TypeError, "an entry must be (atom, class)");
                    goto error;
                }
                value = PyTuple_GET_ITEM(entry, 0);
                Py_INCREF(value);
                cls = PyTuple_GET_ITEM(entry, 1);
            } else if (code >= next_code) {
                if (code - next_code >= learned.count)
                    goto bail;
                Py_ssize_t k = (Py_ssize_t)(code - next_code);
                value = Py_NewRef(learned.atoms[k]);
                cls = learned.classes[k];
            } else if (code == LPAR) {
                if (++nodes > budget || stack.depth >= max_depth)
                    goto bail; /* (the new list is stack.depth + 1 deep) */
                if (push_open(&stack) < 0)
                    goto error;
                if (node != NULL && !whole_at) {
                    int whole = 0;
                    ok = walk_noting(&node, st->speedups.s_lpar, step, refused, &whole,
                                     &sets, &before, why, BR_ITEM, &stack, stack.depth - 1,
                                     token_at);
                    if (ok < 0)
                        goto error;
                    if (ok == 0)
                        goto bail;
                    if (whole && node != NULL)
                        whole_at = stack.depth;
                }
                continue;
            } else if (code == RPAR) {
                if (stack.depth == 0 || top_items(&stack) > max_items)
                    goto bail;
                Py_ssize_t level = stack.depth;
                if ((value = pop_tuple(&stack, &st->values)) == NULL)
                    goto error;
                if (whole_at) {
                    if (whole_at == level)
                        whole_at = 0;
                } else if (node != NULL) {
                    ok = walk_noting(&node, st->speedups.s_rpar, step, refused, NULL, &sets,
                                     &before, why, BR_CLOSE, &stack, stack.depth, token_at);
                    if (ok < 0)
                        goto error;
                    if (ok == 0)
                        goto bail;
                }
                if (stack.depth > 0) {
                    if (push_item(&stack, value) < 0) {
                        value = NULL;
                        goto error;
                    }
                    value = NULL;
                    continue;
                }
                goto done; /* the body is complete */
            } else { /* INTEGER .. URI: the atom's token follows */
                Token a;
                if (!read_token(p, n, &i, &a))
                    goto bail;
                if (code == INTEGER) {
                    if (a.str || a.big)
                        goto bail;
                    value = PyLong_FromLongLong(a.integer);
                    if (value == NULL)
                        goto error;
                    cls = st->speedups.s_integer;
                } else if (code == DECIMAL && a.str && a.len > DECIMAL_MEMO_CHARS) {
                    /* a decimal no memo keeps (atom_of): judged and made from its bytes,
                     * without a str or a lookup (a non-ASCII byte fails is_decimal) */
                    if (a.len > MAX_DECIMAL_CHARS ||
                            !is_decimal((const unsigned char *)a.s, 0, a.len))
                        goto bail;
                    if ((value = decimal_of(&st->values, (const unsigned char *)a.s, a.len,
                                            NULL)) == NULL)
                        goto error;
                    cls = st->speedups.s_kinds[DECIMAL];
                } else {
                    if (!a.str)
                        goto bail;
                    MemoSlot *slot = code != DECIMAL && (code == URI || a.len <= max_name) ?
                        atom_slot(st, (long)code, a.s, a.len) : NULL;
                    if (slot != NULL)
                        value = memo_hit(slot, (long)code, (const unsigned char *)a.s, a.len);
                    if (value == NULL && slot != NULL && (code == SYMBOL || code == KEYWORD) &&
                            st->scanner.intern.symbols != NULL) {
                        /* A name the memo does not hold (ASCII and within the name limit,
                         * or it would have no slot): judged and interned from its bytes,
                         * with no token str, as the text reader does (scanner.c); the memo
                         * keyed by the atom, whose text is the name. */
                        if (!cbcl_ascii_name((const unsigned char *)a.s, a.len,
                                             code == SYMBOL))
                            goto bail;
                        InternTables *names = &st->scanner.intern;
                        value = cbcl_names_intern_ascii(
                            st, (NameTable *)(code == KEYWORD ? names->keywords : names->symbols),
                            a.s, a.len);
                        if (value == NULL)
                            goto error;
                        memo_keep(slot, (long)code, value, value);
                    } else if (value == NULL) {
                        PyObject *text = token_str(&a);
                        if (text == NULL)
                            goto error;
                        if (text == Py_None) {
                            Py_DECREF(text);
                            goto bail;
                        }
                        value = atom_of(st, (long)code, text, caches, make_atom, max_name,
                                        memo_entries);
                        if (slot != NULL && value != NULL && value != Py_None)
                            memo_keep(slot, (long)code, text, value);
                        Py_DECREF(text);
                    }
                    if (value == NULL)
                        goto error;
                    if (value == Py_None)
                        goto bail;
                    cls = st->speedups.s_kinds[code];
                    if (code != DECIMAL) { /* learned: it has the next code from now on */
                        Py_hash_t h = PyObject_Hash(value);
                        if (h == -1)
                            goto error;
                        /* (code_bloom: a bit per hash of the table's atoms; a clear bit
                         * says no atom of the table has this one's hash) */
                        uint64_t bit = (uint64_t)h;
                        if ((ok = code_bloom != NULL &&
                                  !((code_bloom[(bit >> 6) & 3] >> (bit & 63)) & 1) ? 0 :
                                  PyDict_Contains(codes, value)) != 0 ||
                            (ok = learned_has(&learned, value, h)) != 0) {
                            if (ok < 0)
                                goto error;
                            goto bail; /* written in full but it has a code */
                        }
                        if (learned_add(&learned, value, h, cls) < 0)
                            goto error;
                    }
                }
            }
        }
        /* an atom: cls is borrowed from a table that outlives this iteration */
        if (++nodes > budget)
            goto bail;
        if (node != NULL && !whole_at) {
            ok = walk_noting(&node, cls, step, refused, NULL, &sets, &before, why, BR_ITEM,
                             &stack, stack.depth, token_at);
            if (ok < 0)
                goto error;
            if (ok == 0)
                goto bail;
        }
        if (stack.depth == 0)
            goto done; /* the body is one atom */
        if (push_item(&stack, value) < 0) {
            value = NULL;
            goto error;
        }
        value = NULL;
    }
    goto bail; /* the frame ends inside the body */
done:
    if (i != n)
        goto bail;
    if (node != NULL) {
        ok = why == NULL ? 0 : set_frames_copy(&before, &sets);
        if (ok == 0)
            ok = ends(node, st->speedups.s_end, step, accept, &sets);
        if (ok == 0 && why != NULL)
            ok = note_refusal(why, BR_END, node, st->speedups.s_end, &stack, 0, &before,
                              n) < 0 ? -1 : 1;
        if (ok < 0)
            goto error;
        if (ok == 0)
            goto bail;
    }
    result = value;
    value = NULL;
    goto cleanup;
bail:
    result = Py_None;
    Py_INCREF(result);
    goto cleanup;
error:
    result = NULL;
cleanup:
    if (gc_paused)
        PyGC_Enable();
    Py_XDECREF(node);
    Py_XDECREF(value);
    learned_free(&learned);
    stack_free(&stack);
    set_frames_free(&sets);
    set_frames_free(&before);
    return result;
}

static PyObject *
build_body(PyObject *module, PyObject *args)
{
    NativeState *st = native_state(module);
    if (st == NULL)
        return NULL;
    Py_buffer view;
    PyObject *entries, *codes, *caches, *make_atom, *start, *step, *refused, *accept;
    Py_ssize_t offset, max_depth, max_items, max_string, max_name, budget, memo_entries;
    if (!PyArg_ParseTuple(args, "y*nO!O!O!OOOnnnnnOOn", &view, &offset, &PyTuple_Type,
                          &entries, &PyDict_Type, &codes, &PyTuple_Type, &caches, &make_atom,
                          &start, &step, &max_depth, &max_items, &max_string, &max_name,
                          &budget, &refused, &accept, &memo_entries))
        return NULL;
    PyObject *result = build_body_of(st, (const unsigned char *)view.buf, view.len, offset,
                                     entries, codes, caches, make_atom, start, step,
                                     max_depth, max_items, max_string, max_name, budget,
                                     refused, accept, memo_entries, NULL, NULL);
    PyBuffer_Release(&view);
    return result;
}

/* frame_envelope(data, start, intents, uris, max_string, entries) -> tuple | None: the
 * envelope of the frame whose tokens start at data[start] (spec/binary.md: the intent's
 * index, the field bits, the id, sender and receiver, the optional fields the bits name
 * and a signature's two strings), checked as cbcl.binary._codec._fast_message checks them:
 * (intent, bits, message_id, sender, receiver, conversation_id, in_reply_to, reply_by,
 * timestamp, key_id, signed, offset, trace), None for an absent field, `offset` where
 * the body's tokens start. `intents` is cbcl.binary._codec.INTENTS; a URI is looked up in `uris` (the
 * decoder's memo), or validated and made here and remembered there (remember_uri, at most
 * `entries`). None for anything
 * the careful decoder must judge. */
enum { HAS_CONVERSATION_ID = 1, HAS_IN_REPLY_TO = 2, HAS_REPLY_BY = 4, HAS_TIMESTAMP = 8,
       HAS_SIGNATURE = 16, HAS_TRACE = 64, PRESENCES = 128, TRACE_SLOT = 12,
       ENVELOPE_SLOTS = 13 };

static int is_traceparent(PyObject *text); /* (with the envelope walk, below) */

/* frame_envelope's work over p[0:n]: 1 with the fields in `slots` (new references, NULL
 * where absent; slots[11] unused, slots[12] the trace) and where the body starts in
 * *offset, the intent's index in *intent_index and the bits in *bits; 0 to decline (slots emptied); -1 with an
 * exception. */
static int
read_frame_envelope(NativeState *st, const unsigned char *p, Py_ssize_t n, Py_ssize_t start,
                    PyObject *intents, PyObject *uris, Py_ssize_t max_string, Py_ssize_t memo_entries,
                    PyObject **slots, Py_ssize_t *offset, Py_ssize_t *intent_index,
                    long long *bits)
{
    Py_ssize_t i = start;
    int result = 1;
    Token t;
    long long present = 0;
    if (start < 0 || start > n)
        goto bail;
    for (int slot = 0; slot < 11; slot++) {
        if (slot == 9 && (present & HAS_TRACE)) { /* the trace, before the signature */
            if (!read_token(p, n, &i, &t) || !t.str || t.len != 55 || t.len > max_string)
                goto bail;
            PyObject *text = token_str(&t);
            if (text == NULL)
                goto error;
            if (text == Py_None || !is_traceparent(text)) {
                Py_DECREF(text);
                goto bail;
            }
            slots[TRACE_SLOT] = text;
        }
        int bit = slot < 5 ? 0 : slot < 9 ? 1 << (slot - 5) : HAS_SIGNATURE;
        if (bit && !(present & bit))
            continue;
        if (!read_token(p, n, &i, &t))
            goto bail;
        if (slot == 0) { /* the intent */
            if (t.str || t.big || t.integer < 0 || t.integer >= PyTuple_GET_SIZE(intents))
                goto bail;
            slots[0] = PyTuple_GET_ITEM(intents, (Py_ssize_t)t.integer);
            Py_INCREF(slots[0]);
            *intent_index = (Py_ssize_t)t.integer;
        } else if (slot == 1) { /* the field bits */
            if (t.str || t.big || t.integer < 0 || t.integer >= PRESENCES)
                goto bail;
            present = t.integer;
            if ((slots[1] = PyLong_FromLongLong(present)) == NULL)
                goto error;
        } else if (slot == 7 || slot == 8) { /* reply-by, timestamp */
            if (t.str || t.big)
                goto bail;
            if ((slots[slot] = PyLong_FromLongLong(t.integer)) == NULL)
                goto error;
        } else {
            if (!t.str || t.len > max_string)
                goto bail;
            MemoSlot *memo = slot == 3 || slot == 4 ? atom_slot(st, URI, t.s, t.len) : NULL;
            const unsigned char *bytes = (const unsigned char *)t.s;
            if (memo != NULL && (slots[slot] = memo_hit(memo, URI, bytes, t.len)) != NULL)
                continue; /* a URI already made (it was valid) */
            PyObject *text = token_str(&t);
            if (text == NULL)
                goto error;
            if (text == Py_None) {
                Py_DECREF(text);
                goto bail;
            }
            if (slot == 3 || slot == 4) { /* sender, receiver */
                PyObject *uri = PyDict_GetItemWithError(uris, text);
                if (uri != NULL) {
                    Py_INCREF(uri);
                } else if (PyErr_Occurred()) {
                    Py_DECREF(text);
                    goto error;
                } else if (!valid_uri(text)) {
                    Py_DECREF(text);
                    goto bail;
                } else {
                    uri = remember_uri(&st->values, uris, text, memo_entries);
                }
                if (memo != NULL && uri != NULL && uri != Py_None)
                    memo_keep(memo, URI, text, uri);
                Py_DECREF(text);
                if (uri == NULL)
                    goto error;
                if (uri == Py_None) {
                    Py_DECREF(uri);
                    goto bail;
                }
                slots[slot] = uri;
            } else {
                /* the id and the optional strings are never empty (the signature's may be) */
                if (slot < 9 && PyUnicode_GET_LENGTH(text) == 0) {
                    Py_DECREF(text);
                    goto bail;
                }
                slots[slot] = text;
            }
        }
    }
    *offset = i;
    *bits = present;
    return 1;
bail:
    result = 0;
    goto cleanup;
error:
    result = -1;
cleanup:
    for (int slot = 0; slot < ENVELOPE_SLOTS; slot++)
        Py_CLEAR(slots[slot]);
    return result;
}

static PyObject *
frame_envelope(PyObject *module, PyObject *args)
{
    NativeState *st = native_state(module);
    if (st == NULL)
        return NULL;
    Py_buffer view;
    Py_ssize_t start, max_string, memo_entries, offset = 0, intent_index = 0;
    long long bits = 0;
    PyObject *intents, *uris;
    if (!PyArg_ParseTuple(args, "y*nO!O!nn", &view, &start, &PyTuple_Type, &intents,
                          &PyDict_Type, &uris, &max_string, &memo_entries))
        return NULL;
    PyObject *slots[ENVELOPE_SLOTS] = {NULL};
    PyObject *result = NULL;
    int ok = read_frame_envelope(st, (const unsigned char *)view.buf, view.len, start,
                                 intents, uris, max_string, memo_entries, slots, &offset,
                                 &intent_index, &bits);
    PyBuffer_Release(&view);
    if (ok <= 0)
        return ok < 0 ? NULL : Py_NewRef(Py_None);
    if ((slots[11] = PyLong_FromSsize_t(offset)) != NULL &&
            (result = PyTuple_New(ENVELOPE_SLOTS)) != NULL) {
        for (int slot = 0; slot < ENVELOPE_SLOTS; slot++) {
            PyTuple_SET_ITEM(result, slot, slots[slot] != NULL ? slots[slot] : Py_NewRef(Py_None));
            slots[slot] = NULL;
        }
    }
    for (int slot = 0; slot < ENVELOPE_SLOTS; slot++)
        Py_XDECREF(slots[slot]);
    return result;
}

/* recognise(body, node, classes, terminals, step, refused, accept) -> bool: the twin of
 * the loop of cbcl.protocol._pass2.recognise_body, walking a body already read (tuples and atoms)
 * through the protocol's StackAutomaton from `node`, with an explicit stack of the lists
 * under way (no recursion). An atom's class is classes[atom] for a symbol or keyword that
 * spells a grammar literal, else terminals[type(atom)]; a list is LPAR, its items, RPAR,
 * or, where the LPAR transition says so, a whole value, not walked. Raises nothing for any
 * body: a value of a type the terminals do not name is refused (False). */
typedef struct {
    PyObject *list; /* borrowed: the body holds it */
    Py_ssize_t next;
} Frame;

/* Passages: walk's memo of the transitions it has taken, so that a body whose rows repeat
 * one shape (the usual body: records in a list) pays a node's dict lookup and the
 * decoding of its entry once per (node, class), not once per token. Direct-mapped by the
 * two pointers; everything in it is borrowed: a node's entries change only in `step`, and
 * nodes are freed only after one (a flush), so the memo serves only until the walk's first
 * call to `step` (then `off`), which keeps every pointer in it alive and unchanged. A hit
 * is the entry advance_noting would decode from the dict, so it takes the same path.
 *
 * The slots are the module state's (SpeedupsState.passages, made at the first walk; no
 * clearing a walk: a slot serves the walk whose stamp it carries, and stamps are never
 * reused), so a walk that ran Python code (step, an atom's __eq__) and so maybe another
 * walk, on this thread or another, finds its slots taken, never wrong. */
#define PASSAGE_SLOTS 256 /* a power of two */
#define PASSAGE_OPS 4     /* set operations decoded in place; more: read from the tuple */
#define LITERAL_SLOTS 64  /* a power of two */
#define LITERAL_BLOOM_AFTER 8 /* literal lookups that missed before the filter is built */

typedef struct {
    unsigned long long stamp; /* the walk it serves */
    PyObject *node, *cls;     /* the key */
    PyObject *next;           /* where it leads: a node, REFUSED or ACCEPT */
    PyObject *ops;            /* its set operations (a tuple), or NULL */
    unsigned long long codes[PASSAGE_OPS];
    int whole, n_codes;       /* n_codes -1: read `ops` (apply_set_ops) */
} Passage;

typedef struct {
    unsigned long long stamp;
    PyObject *atom, *cls; /* cls NULL: the atom is no grammar literal */
} LiteralSlot;

struct PassageSlots { /* (native.h: SpeedupsState.passages) */
    unsigned long long stamp; /* the last walk's */
    Passage slot[PASSAGE_SLOTS];
    LiteralSlot literal[LITERAL_SLOTS];
};

/* One walk's view of the memo: its stamp, the types met and their classes, and a filter
 * of the hashes of the grammar's literal atoms (bit h % 256 set for each), which tells most
 * atoms that are no literal without a lookup (an atom's hash is str's, which the dict uses). */
typedef struct {
    unsigned long long stamp;
    Passage *slot;        /* the thread's */
    LiteralSlot *literal; /* the thread's */
    PyTypeObject *types[8];
    PyObject *type_classes[8];
    int n_types, off, misses;
    unsigned long long bloom[4]; /* valid once misses > LITERAL_BLOOM_AFTER */
} Passages;

/* Start a walk's view of the memo: 0, or -1 with MemoryError (the slots not made). */
static inline int
passages_start(SpeedupsState *sp, Passages *memo)
{
    if (sp->passages == NULL &&
            (sp->passages = PyMem_Calloc(1, sizeof(struct PassageSlots))) == NULL) {
        PyErr_NoMemory();
        return -1;
    }
    struct PassageSlots *mine = sp->passages;
    memo->stamp = ++mine->stamp;
    memo->slot = mine->slot;
    memo->literal = mine->literal;
    memo->n_types = memo->off = memo->misses = 0;
    return 0;
}

static inline size_t
passage_hash(PyObject *a, PyObject *b)
{
    size_t h = ((size_t)(uintptr_t)a >> 4) * 0x9E3779B1u ^ ((size_t)(uintptr_t)b >> 4);
    return (h ^ (h >> 7)) & (PASSAGE_SLOTS - 1);
}

/* The grammar-literal class of `item` (a Symbol or Keyword) in `classes` (borrowed), NULL
 * for none (*error set with an exception): classes.get(item), through the memo. */
static PyObject *
literal_class(Passages *memo, PyObject *classes, PyObject *item, int *error)
{
    LiteralSlot *slot = &memo->literal[((size_t)(uintptr_t)item >> 4) & (LITERAL_SLOTS - 1)];
    if (slot->stamp == memo->stamp && slot->atom == item && !memo->off)
        return slot->cls;
    if (memo->misses > LITERAL_BLOOM_AFTER) {
        Py_hash_t h = ((PyASCIIObject *)item)->hash; /* (an exact str subclass's: str's) */
        if (h != -1 && !(memo->bloom[(h >> 6) & 3] & (1ULL << (h & 63))))
            return NULL; /* no key has its hash */
    }
    PyObject *literal = PyDict_GetItemWithError(classes, item);
    if (literal == NULL) {
        if (PyErr_Occurred()) {
            *error = 1;
            return NULL;
        }
        if (++memo->misses == LITERAL_BLOOM_AFTER + 1) { /* (the filter, once a walk) */
            memset(memo->bloom, 0, sizeof memo->bloom);
            Py_ssize_t at = 0;
            PyObject *key, *value;
            while (PyDict_Next(classes, &at, &key, &value)) {
                Py_hash_t kh = PyObject_Hash(key);
                if (kh == -1) { /* (cannot be for the atoms a grammar has: no filter) */
                    PyErr_Clear();
                    memo->misses = INT_MIN;
                    break;
                }
                memo->bloom[(kh >> 6) & 3] |= 1ULL << (kh & 63);
            }
        }
    }
    slot->stamp = memo->stamp;
    slot->atom = item;
    slot->cls = literal;
    return literal;
}

/* Decode `found` (node[cls], borrowed) into `p` as advance_noting reads it (`lpar`: LPAR's
 * (node, whole[, ops])): 1, or 0 for an entry of another shape (advance_noting raises). */
static int
passage_fill(Passage *p, PyObject *found, int lpar)
{
    PyObject *ops = NULL;
    p->whole = 0;
    p->next = found;
    if (lpar) {
        if (!PyTuple_CheckExact(found) ||
                (PyTuple_GET_SIZE(found) != 2 && PyTuple_GET_SIZE(found) != 3))
            return 0;
        p->whole = PyTuple_GET_ITEM(found, 1) == Py_True;
        if (PyTuple_GET_SIZE(found) == 3)
            ops = PyTuple_GET_ITEM(found, 2);
        p->next = PyTuple_GET_ITEM(found, 0);
    } else if (PyTuple_CheckExact(found)) {
        if (PyTuple_GET_SIZE(found) != 2)
            return 0;
        ops = PyTuple_GET_ITEM(found, 1);
        p->next = PyTuple_GET_ITEM(found, 0);
    }
    p->ops = ops;
    p->n_codes = -1;
    if (ops != NULL && PyTuple_CheckExact(ops) && PyTuple_GET_SIZE(ops) <= PASSAGE_OPS) {
        int n = (int)PyTuple_GET_SIZE(ops);
        for (int k = 0; k < n; k++) {
            PyObject *op = PyTuple_GET_ITEM(ops, k);
            if (!PyLong_CheckExact(op))
                goto keep_tuple;
            int overflow;
            long long v = PyLong_AsLongLongAndOverflow(op, &overflow);
            if (overflow || v < 0) {
                if (PyErr_Occurred())
                    PyErr_Clear(); /* (apply_set_ops reads it, and says what it is) */
                goto keep_tuple;
            }
            p->codes[k] = (unsigned long long)v;
        }
        p->n_codes = n;
    }
keep_tuple:
    return 1;
}

/* advance_noting through the memo: the same result, the same frames. */
static inline int
advance_memo(Passages *memo, PyObject **node, PyObject *cls, PyObject *step,
             PyObject *refused, int *whole, SetFrames *frames, SetFrames *before)
{
    if (memo->off)
        return advance_noting(node, cls, step, refused, whole, frames, before);
    Passage *p = &memo->slot[passage_hash(*node, cls)];
    if (p->stamp != memo->stamp || p->node != *node || p->cls != cls) {
        PyObject *found = PyDict_GetItemWithError(*node, cls);
        if (found == NULL) {
            if (PyErr_Occurred())
                return -1;
            memo->off = 1; /* (step runs: from here the memo's pointers may not hold) */
            return advance_noting(node, cls, step, refused, whole, frames, before);
        }
        if (!passage_fill(p, found, whole != NULL)) {
            p->stamp = 0;
            return advance_noting(node, cls, step, refused, whole, frames, before);
        }
        p->stamp = memo->stamp;
        p->node = *node;
        p->cls = cls;
    }
    if (whole != NULL)
        *whole = p->whole;
    PyObject *next = p->next;
    if (p->ops != NULL && next != refused) {
        if (before != NULL && set_frames_copy(before, frames) < 0)
            return -1;
        int ok = 1;
        if (p->n_codes >= 0) {
            for (int k = 0; k < p->n_codes && ok == 1; k++)
                ok = apply_set_op(frames, p->codes[k]);
        } else {
            ok = apply_set_ops(frames, p->ops);
        }
        if (ok <= 0)
            return ok;
    }
    if (next == refused)
        return 0;
    Py_INCREF(next);
    Py_SETREF(*node, next);
    return 1;
}

/* The walk of recognise from `start` (a dict): 1 accepted, 0 refused, -1 with an
 * exception. */
static int walk_refused(BodyRefusal *why, int kind, PyObject *node, PyObject *cls,
                        const Frame *frames, Py_ssize_t depth, const SetFrames *sets,
                        const SetFrames *before);

static int
walk(NativeState *st, PyObject *body, PyObject *start, PyObject *classes, PyObject *terminals,
     PyObject *step, PyObject *refused, PyObject *accept, BodyRefusal *why)
{
    PyObject *node = start; /* a strong reference (step may flush the automaton) */
    Py_INCREF(node);
    SetFrames sets; /* the keyword sets' masks (advance) */
    set_frames_init(&sets);
    SetFrames before; /* with `why`: the masks before a transition's set operations */
    set_frames_init(&before);
    SetFrames *keep = why == NULL ? NULL : &before;
    Frame *frames = NULL;
    Py_ssize_t depth = 0, capacity = 0;
    PyObject *item = body; /* borrowed */
    Passages memo; /* (the transitions taken: advance_memo) */
    if (passages_start(&st->speedups, &memo) < 0) {
        Py_DECREF(node);
        return -1;
    }
    int ok;
    for (;;) {
        if (item != NULL) {
            if (PyTuple_CheckExact(item)) {
                int whole = 0;
                before.depth = -1;
                ok = advance_memo(&memo, &node, st->speedups.s_lpar, step, refused, &whole,
                                  &sets, keep);
                if (ok == 0 && why != NULL)
                    ok = walk_refused(why, BR_ITEM, node, st->speedups.s_lpar, frames, depth,
                                      &sets, &before);
                if (ok <= 0)
                    goto finish;
                if (!whole) {
                    if (depth == capacity) {
                        Py_ssize_t more = capacity ? 2 * capacity : 16;
                        Frame *grown = PyMem_Realloc(frames, (size_t)more * sizeof(Frame));
                        if (grown == NULL) {
                            PyErr_NoMemory();
                            ok = -1;
                            goto finish;
                        }
                        frames = grown;
                        capacity = more;
                    }
                    frames[depth].list = item;
                    frames[depth].next = 0;
                    depth++;
                }
            } else {
                /* its class: terminals[type], the types met kept in the memo (a type is
                 * held by its values: alive while the body is) */
                PyTypeObject *type = Py_TYPE(item);
                PyObject *cls = NULL;
                for (int k = 0; k < memo.n_types; k++)
                    if (memo.types[k] == type) {
                        cls = memo.type_classes[k];
                        break;
                    }
                if (cls == NULL) {
                    cls = PyDict_GetItemWithError(terminals, (PyObject *)type);
                    if (cls == NULL) {
                        ok = PyErr_Occurred() ? -1 : 0; /* not a CBCL value: refused */
                        goto finish;
                    }
                    if (memo.n_types < (int)(sizeof memo.types / sizeof memo.types[0]) &&
                            !memo.off) {
                        memo.types[memo.n_types] = type;
                        memo.type_classes[memo.n_types++] = cls;
                    }
                }
                if (cls == st->speedups.s_kinds[SYMBOL] || cls == st->speedups.s_kinds[KEYWORD]) {
                    /* a grammar literal's class: classes[item] (literal_class) */
                    int error = 0;
                    PyObject *literal = literal_class(&memo, classes, item, &error);
                    if (error) {
                        ok = -1;
                        goto finish;
                    }
                    if (literal != NULL)
                        cls = literal;
                }
                Py_INCREF(cls); /* the lookups' dicts may change under step */
                before.depth = -1;
                ok = advance_memo(&memo, &node, cls, step, refused, NULL, &sets, keep);
                if (ok == 0 && why != NULL)
                    ok = walk_refused(why, BR_ITEM, node, cls, frames, depth, &sets, &before);
                Py_DECREF(cls);
                if (ok <= 0)
                    goto finish;
            }
            item = NULL;
        }
        if (depth == 0)
            break; /* the body is walked */
        Frame *top = &frames[depth - 1];
        if (top->next < PyTuple_GET_SIZE(top->list)) {
            item = PyTuple_GET_ITEM(top->list, top->next);
            top->next++;
            continue;
        }
        depth--; /* the list is complete */
        before.depth = -1;
        ok = advance_memo(&memo, &node, st->speedups.s_rpar, step, refused, NULL, &sets,
                          keep);
        if (ok == 0 && why != NULL)
            ok = walk_refused(why, BR_CLOSE, node, st->speedups.s_rpar, frames, depth, &sets,
                              &before);
        if (ok <= 0)
            goto finish;
    }
    ok = why == NULL ? 0 : set_frames_copy(&before, &sets);
    if (ok == 0)
        ok = ends(node, st->speedups.s_end, step, accept, &sets);
    if (ok == 0 && why != NULL)
        ok = walk_refused(why, BR_END, node, st->speedups.s_end, frames, 0, &sets, &before);
finish:
    Py_DECREF(node);
    PyMem_Free(frames);
    set_frames_free(&sets);
    set_frames_free(&before);
    return ok;
}

/* Note walk's refusal in `why` (path: the index of the element under way in each of the
 * first `depth` lists; the masks before the transition: `before` where it made a copy,
 * else `sets`): 0 (the walk's refused), or -1 with an exception. */
static int
walk_refused(BodyRefusal *why, int kind, PyObject *node, PyObject *cls, const Frame *frames,
             Py_ssize_t depth, const SetFrames *sets, const SetFrames *before)
{
    PyObject *path = PyTuple_New(depth);
    if (path == NULL)
        return -1;
    for (Py_ssize_t k = 0; k < depth; k++) {
        PyObject *index = PyLong_FromSsize_t(frames[k].next - 1);
        if (index == NULL) {
            Py_DECREF(path);
            return -1;
        }
        PyTuple_SET_ITEM(path, k, index);
    }
    Stack none = STACK_INIT; /* (note_refusal's path from a stack of no lists) */
    int ok = note_refusal(why, kind, node, cls, &none, 0, before->depth >= 0 ? before : sets,
                          0);
    if (ok < 0) {
        Py_DECREF(path);
        return -1;
    }
    Py_SETREF(why->path, path);
    return 0;
}

/* refusal_of(body, node, classes, terminals, step, refused, accept) -> tuple | None: the
 * walk of recognise, reporting where the grammar refused the body: None if it accepts it,
 * else (kind, path, node, cls, frames) as decode_frame reports a refusal to
 * cbcl.binary._codec._frame_refusal (kind 1 ITEM, 2 CLOSE, 3 END; the node the refused token was
 * fed to, its class, the keyword sets' masks then). cbcl.protocol._pass2.find_refusal's
 * native tier: one walk up to the refusal. TypeError for a value that is not a CBCL one. */
static PyObject *
refusal_of(PyObject *module, PyObject *args)
{
    NativeState *st = native_state(module);
    if (st == NULL)
        return NULL;
    PyObject *body, *start, *classes, *terminals, *step, *refused, *accept;
    if (!PyArg_ParseTuple(args, "OO!O!O!OOO", &body, &PyDict_Type, &start, &PyDict_Type,
                          &classes, &PyDict_Type, &terminals, &step, &refused, &accept))
        return NULL;
    BodyRefusal why = BODY_REFUSAL_INIT;
    int ok = walk(st, body, start, classes, terminals, step, refused, accept, &why);
    PyObject *result = NULL;
    if (ok > 0) {
        result = Py_NewRef(Py_None);
    } else if (ok == 0 && why.kind == BR_NONE) {
        PyErr_SetString(PyExc_TypeError, "not a CBCL value in the body");
    } else if (ok == 0) {
        result = Py_BuildValue("(iOOOO)", why.kind, why.path, why.node, why.cls, why.frames);
    }
    body_refusal_free(&why);
    return result;
}

/* text_index(text, path, kind) -> int: where in `text` (a document the reader has read
 * whole, so well formed) the token a refusal points at is, as a character index: the
 * twin of cbcl.protocol._pass2.refusal_index_python. `path`: the index of the element on
 * the way down from the document's value to the refused one (the body's path, then the
 * refusal's); `kind`: 1 ITEM (the token that starts that element), 2 CLOSE (the `)` of
 * the list there), 3 END (just after that value). One lexical pass over the text up to
 * that point, building nothing: whitespace and comments stepped over, a string to its
 * closing quote, an atom to its delimiter, a list to its `)` by depth (one test a
 * character, in a loop made for each width of str). ValueError where the text does not
 * hold that path (it is not the document the path was taken in). */

/* TEXT_SCAN(T, W): scan_space_W, scan_atom_W, scan_value_W and index_of_W over the
 * characters of a str of width T (Py_UCS1, Py_UCS2, Py_UCS4). */
#define TEXT_SCAN(T, W)                                                                    \
/* The first index at or after `i` not in whitespace or a comment (as TOKEN skips them;   \
 * in text read whole, a comment ends at a line's end). */                                 \
static Py_ssize_t                                                                          \
scan_space_##W(const T *s, Py_ssize_t n, Py_ssize_t i)                                     \
{                                                                                          \
    while (i < n) {                                                                        \
        T c = s[i];                                                                        \
        if (c == ' ' || c == '\t' || c == '\r' || c == '\n') {                             \
            i++;                                                                           \
        } else if (c == ';') {                                                             \
            while (i < n && s[i] != '\n' && s[i] != '\r')                                  \
                i++;                                                                       \
        } else {                                                                           \
            break;                                                                         \
        }                                                                                  \
    }                                                                                      \
    return i;                                                                              \
}                                                                                          \
                                                                                           \
/* Just after the string whose quote is at `i`. */                                         \
static Py_ssize_t                                                                          \
scan_string_##W(const T *s, Py_ssize_t n, Py_ssize_t i)                                    \
{                                                                                          \
    for (i++; i < n; i++) {                                                                \
        if (s[i] == '\\')                                                                  \
            i++;                                                                           \
        else if (s[i] == '"')                                                              \
            return i + 1;                                                                  \
    }                                                                                      \
    return n;                                                                              \
}                                                                                          \
                                                                                           \
/* Just after the value whose token starts at or after `i`; -1 at the text's end or at a  \
 * `)` (no value there). */                                                                \
static Py_ssize_t                                                                          \
scan_value_##W(const T *s, Py_ssize_t n, Py_ssize_t i)                                     \
{                                                                                          \
    i = scan_space_##W(s, n, i);                                                           \
    if (i >= n || s[i] == ')')                                                             \
        return -1;                                                                         \
    if (s[i] == '"')                                                                       \
        return scan_string_##W(s, n, i);                                                   \
    if (s[i] != '(') {                                                                     \
        while (i < n && s[i] != ' ' && s[i] != '\t' && s[i] != '\r' && s[i] != '\n' &&    \
               s[i] != '(' && s[i] != ')' && s[i] != ';')                                  \
            i++;                                                                           \
        return i;                                                                          \
    }                                                                                      \
    Py_ssize_t depth = 0;                                                                  \
    while (i < n) {                                                                        \
        T c = s[i];                                                                        \
        if (c == '(') {                                                                    \
            depth++;                                                                       \
        } else if (c == ')') {                                                             \
            if (--depth == 0)                                                              \
                return i + 1;                                                              \
        } else if (c == '"') {                                                             \
            i = scan_string_##W(s, n, i);                                                  \
            continue;                                                                      \
        } else if (c == ';') {                                                             \
            while (i < n && s[i] != '\n' && s[i] != '\r')                                  \
                i++;                                                                       \
            continue;                                                                      \
        }                                                                                  \
        i++;                                                                               \
    }                                                                                      \
    return -1;                                                                             \
}                                                                                          \
                                                                                           \
/* text_index's answer: the index, -1 where the text does not hold the path, -2 with an   \
 * exception. */                                                                           \
static Py_ssize_t                                                                          \
index_of_##W(const T *s, Py_ssize_t n, PyObject *path, int kind)                           \
{                                                                                          \
    Py_ssize_t pos = scan_space_##W(s, n, 0);                                              \
    for (Py_ssize_t k = 0; k < PyTuple_GET_SIZE(path); k++) {                              \
        Py_ssize_t index = PyLong_AsSsize_t(PyTuple_GET_ITEM(path, k));                    \
        if (index == -1 && PyErr_Occurred())                                               \
            return -2;                                                                     \
        if (pos >= n || s[pos] != '(' || index < 0)                                        \
            return -1;                                                                     \
        pos++; /* (past the list's '(') */                                                 \
        for (Py_ssize_t skipped = 0; skipped < index; skipped++) {                         \
            pos = scan_value_##W(s, n, pos);                                               \
            if (pos < 0)                                                                   \
                return -1;                                                                 \
        }                                                                                  \
        pos = scan_space_##W(s, n, pos); /* the element's token */                         \
    }                                                                                      \
    if (pos >= n)                                                                          \
        return -1;                                                                         \
    if (kind == 2) { /* CLOSE: the list's elements stepped over, its ')' */                \
        if (s[pos] != '(')                                                                 \
            return -1;                                                                     \
        pos = scan_value_##W(s, n, pos);                                                   \
        return pos < 0 ? -1 : pos - 1;                                                     \
    }                                                                                      \
    if (kind == 3) /* END: just after the value */                                         \
        return scan_value_##W(s, n, pos);                                                  \
    return pos;                                                                            \
}

TEXT_SCAN(Py_UCS1, 1)
TEXT_SCAN(Py_UCS2, 2)
TEXT_SCAN(Py_UCS4, 4)
#undef TEXT_SCAN

static PyObject *
text_index(PyObject *module, PyObject *args)
{
    (void)module;
    PyObject *text, *path;
    int kind;
    if (!PyArg_ParseTuple(args, "UO!i", &text, &PyTuple_Type, &path, &kind))
        return NULL;
    if (kind < 1 || kind > 3) {
        PyErr_SetString(PyExc_ValueError, "kind is 1 (ITEM), 2 (CLOSE) or 3 (END)");
        return NULL;
    }
    Py_ssize_t n = PyUnicode_GET_LENGTH(text), pos;
    switch (PyUnicode_KIND(text)) {
    case PyUnicode_1BYTE_KIND:
        pos = index_of_1(PyUnicode_1BYTE_DATA(text), n, path, kind);
        break;
    case PyUnicode_2BYTE_KIND:
        pos = index_of_2(PyUnicode_2BYTE_DATA(text), n, path, kind);
        break;
    default:
        pos = index_of_4(PyUnicode_4BYTE_DATA(text), n, path, kind);
        break;
    }
    if (pos == -2)
        return NULL;
    if (pos < 0) {
        PyErr_SetString(PyExc_ValueError, "the text does not hold that path");
        return NULL;
    }
    return PyLong_FromSsize_t(pos);
}

static PyObject *
recognise(PyObject *module, PyObject *args)
{
    NativeState *st = native_state(module);
    if (st == NULL)
        return NULL;
    PyObject *body, *start, *classes, *terminals, *step, *refused, *accept;
    if (!PyArg_ParseTuple(args, "OO!O!O!OOO", &body, &PyDict_Type, &start, &PyDict_Type,
                          &classes, &PyDict_Type, &terminals, &step, &refused, &accept))
        return NULL;
    int ok = walk(st, body, start, classes, terminals, step, refused, accept, NULL);
    return ok < 0 ? NULL : PyBool_FromLong(ok);
}

/* envelope(value, version, fields, intents, signature, message, attributes) -> Message |
 * None: the twin of cbcl.protocol._envelope._walk and Message._trusted together. `value` is a whole
 * document as read; `version` the symbol CBCL/1.0; `fields` maps each field's symbol to
 * (order, kind), its place in grammar order (= its index in `attributes`, the Message
 * attribute names) and what it holds (the kinds of cbcl.protocol._envelope: ID, URI, INTENT,
 * SYMBOL, INT, VALUE, SIGNATURE); `intents` maps the intent symbols to the Intent members;
 * `signature` is the Signature type and `message` the Message type, whose instance is made
 * without __init__ and given every attribute (None where a field is absent). None where
 * the envelope grammar refuses the value (the caller re-scans to say why). */
enum { F_ID, F_URI, F_INTENT, F_SYMBOL, F_INT, F_VALUE, F_SIGNATURE, F_TRACE, F_COUNT = 12,
       F_REQUIRED = 5 };

static_assert(F_COUNT == CBCL_MESSAGE_FIELDS, "a Message's fields: one per field");

/* The attribute names of a Message's fields in grammar order (MessageFieldsObject's). */
static const char *const MESSAGE_ATTRIBUTES[F_COUNT] = {
    "message_id", "sender", "receiver", "intent", "protocol", "conversation_id",
    "in_reply_to", "reply_by", "timestamp", "trace", "body", "signature"};

/* Whether `text` is what a (trace …) field may hold (cbcl.protocol._message.is_traceparent):
 * an exact str of 55 ASCII characters "00-<32 hex>-<16 hex>-<2 hex>", lower-case hex,
 * neither id all zeros. */
static int
is_traceparent(PyObject *text)
{
    if (!PyUnicode_CheckExact(text) || PyUnicode_GET_LENGTH(text) != 55 ||
            !PyUnicode_IS_ASCII(text))
        return 0;
    const char *s = (const char *)PyUnicode_1BYTE_DATA(text);
    if (s[0] != '0' || s[1] != '0' || s[2] != '-' || s[35] != '-' || s[52] != '-')
        return 0;
    int trace_zero = 1, parent_zero = 1;
    for (int i = 3; i < 55; i++) {
        if (i == 35 || i == 52)
            continue;
        char c = s[i];
        if (!((c >= '0' && c <= '9') || (c >= 'a' && c <= 'f')))
            return 0;
        if (c != '0') {
            if (i < 35)
                trace_zero = 0;
            else if (i < 52)
                parent_zero = 0;
        }
    }
    return !trace_zero && !parent_zero;
}

/* Whether `attributes` (a tuple) names a Message's fields in grammar order, the order
 * cbcl_message_new takes their values in: 1 or 0 (no exception). The last two tuples met
 * that do are remembered (st->speedups.grammar_names, grammar_names_also: the
 * envelope's, the frame decoder's, Message._trusted's), so that a run of calls from one
 * caller compares no names after its first. */
static int
in_grammar_order(SpeedupsState *sp, PyObject *attributes)
{
    if (attributes == sp->grammar_names || attributes == sp->grammar_names_also)
        return 1;
    if (PyTuple_GET_SIZE(attributes) != F_COUNT)
        return 0;
    for (Py_ssize_t k = 0; k < F_COUNT; k++) {
        PyObject *name = PyTuple_GET_ITEM(attributes, k);
        if (!PyUnicode_Check(name) ||
                PyUnicode_CompareWithASCIIString(name, MESSAGE_ATTRIBUTES[k]) != 0)
            return 0;
    }
    Py_XSETREF(sp->grammar_names_also, sp->grammar_names);
    sp->grammar_names = Py_NewRef(attributes);
    return 1;
}

/* An instance of `type` made without __init__ (as object.__new__ makes it), given each
 * attribute of `attributes` (a tuple of names) its value in `values` (NULL: None): a new
 * reference, or NULL with an exception. The registered Message (setup_message: a class
 * over MessageFields) with its fields in grammar order is filled in its struct
 * (cbcl_message_new); any other type is given each attribute as object.__setattr__ gives
 * it, past a frozen dataclass's __setattr__. */
static PyObject *
new_with_attributes(NativeState *st, PyTypeObject *type, PyObject *attributes,
                    PyObject *const *values)
{
    if (type == st->encoders.message && in_grammar_order(&st->speedups, attributes))
        return cbcl_message_new(type, values);
    PyObject *made = type->tp_alloc(type, 0);
    if (made == NULL)
        return NULL;
    for (Py_ssize_t k = 0; k < PyTuple_GET_SIZE(attributes); k++) {
        PyObject *value = values[k] != NULL ? values[k] : Py_None;
        if (PyObject_GenericSetAttr(made, PyTuple_GET_ITEM(attributes, k), value) < 0) {
            Py_DECREF(made);
            return NULL;
        }
    }
    return made;
}

/* A Signature(key_id, value) of type `signature`: filled in its struct where it is the
 * registered one (setup_message), else by calling it. */
static PyObject *
new_signature(NativeState *st, PyObject *signature, PyObject *key_id, PyObject *value)
{
    if ((PyTypeObject *)signature == st->encoders.signature)
        return cbcl_signature_new((PyTypeObject *)signature, key_id, value);
    return PyObject_CallFunctionObjArgs(signature, key_id, value, NULL);
}

/* make_object(type, attributes, values) -> object: new_with_attributes, for
 * Message._trusted (its fields checked by the caller). */
static PyObject *
make_object(PyObject *module, PyObject *args)
{
    NativeState *st = native_state(module);
    if (st == NULL)
        return NULL;
    PyObject *type, *attributes, *values;
    if (!PyArg_ParseTuple(args, "O!O!O!", &PyType_Type, &type, &PyTuple_Type, &attributes,
                          &PyTuple_Type, &values))
        return NULL;
    if (PyTuple_GET_SIZE(values) != PyTuple_GET_SIZE(attributes)) {
        PyErr_SetString(PyExc_ValueError, "one value per attribute");
        return NULL;
    }
    if (((PyTypeObject *)type)->tp_new != PyBaseObject_Type.tp_new) {
        PyErr_SetString(PyExc_TypeError, "a type that object.__new__ makes");
        return NULL;
    }
    return new_with_attributes(st, (PyTypeObject *)type, attributes,
                               &PyTuple_GET_ITEM(values, 0));
}

/* envelope's work, its arguments checked: a new reference (the Message or Py_None), or
 * NULL with an exception. With `out` (F_COUNT slots), a Message's fields are also left
 * there in grammar order (NULL: absent), borrowed from the Message. */
static PyObject *
envelope_of(NativeState *st, PyObject *value, PyObject *version, PyObject *fields,
            PyObject *intents, PyObject *signature, PyObject *message, PyObject *attributes,
            PyTypeObject *uri_type, PyTypeObject *symbol_type, PyObject **out)
{
    PyObject *found[F_COUNT] = {NULL}; /* new references */
    PyObject *result = NULL;
    Py_ssize_t expected = 0, size, index;
    if (!PyTuple_CheckExact(value) || (size = PyTuple_GET_SIZE(value)) < 1 + F_REQUIRED)
        Py_RETURN_NONE;
    PyObject *head = PyTuple_GET_ITEM(value, 0);
    if (Py_TYPE(head) != symbol_type)
        Py_RETURN_NONE;
    if (head != version) {
        int same = PyUnicode_Compare(head, version);
        if (same == -1 && PyErr_Occurred())
            return NULL;
        if (same != 0)
            Py_RETURN_NONE;
    }
    for (index = 1; index < size; index++) {
        PyObject *field = PyTuple_GET_ITEM(value, index);
        if (!PyTuple_CheckExact(field) || PyTuple_GET_SIZE(field) < 2 ||
                Py_TYPE(PyTuple_GET_ITEM(field, 0)) != symbol_type)
            goto refused;
        PyObject *spec = PyDict_GetItemWithError(fields, PyTuple_GET_ITEM(field, 0));
        if (spec == NULL) {
            if (PyErr_Occurred())
                goto error;
            goto refused;
        }
        Py_ssize_t order = PyLong_AsSsize_t(PyTuple_GET_ITEM(spec, 0));
        long kind = PyLong_AsLong(PyTuple_GET_ITEM(spec, 1));
        if (PyErr_Occurred())
            goto error;
        if (order < 0 || order >= F_COUNT)
            goto refused;
        if (order < expected || (order != expected && expected < F_REQUIRED))
            goto refused;
        expected = order + 1;
        PyObject *item = PyTuple_GET_ITEM(field, 1);
        if (kind == F_SIGNATURE) {
            if (PyTuple_GET_SIZE(field) != 3 || !PyUnicode_CheckExact(item) ||
                    !PyUnicode_CheckExact(PyTuple_GET_ITEM(field, 2)))
                goto refused;
            found[order] = new_signature(st, signature, item, PyTuple_GET_ITEM(field, 2));
            if (found[order] == NULL)
                goto error;
            continue;
        }
        if (PyTuple_GET_SIZE(field) != 2)
            goto refused;
        switch (kind) {
        case F_ID:
            if (!PyUnicode_CheckExact(item) || PyUnicode_GET_LENGTH(item) == 0)
                goto refused;
            break;
        case F_URI:
            if (Py_TYPE(item) != uri_type)
                goto refused;
            break;
        case F_INTENT:
            if (Py_TYPE(item) != symbol_type)
                goto refused;
            item = PyDict_GetItemWithError(intents, item);
            if (item == NULL) {
                if (PyErr_Occurred())
                    goto error;
                goto refused;
            }
            break;
        case F_SYMBOL:
            if (Py_TYPE(item) != symbol_type)
                goto refused;
            break;
        case F_INT:
            if (!PyLong_CheckExact(item))
                goto refused;
            break;
        case F_TRACE:
            if (!is_traceparent(item))
                goto refused;
            break;
        default:
            break;
        }
        Py_INCREF(item);
        found[order] = item;
    }
    if (expected < F_REQUIRED)
        goto refused;
    result = new_with_attributes(st, (PyTypeObject *)message, attributes, found);
    if (result == NULL)
        goto error;
    if (out != NULL)
        for (index = 0; index < F_COUNT; index++)
            out[index] = found[index];
    goto cleanup;
refused:
    result = Py_None;
    Py_INCREF(result);
    goto cleanup;
error:
    result = NULL;
cleanup:
    for (index = 0; index < F_COUNT; index++)
        Py_XDECREF(found[index]);
    return result;
}

/* Whether `attributes` are a Message's 12 (else ValueError): 1, or 0 with the exception. */
static int
message_attributes_ok(PyObject *attributes)
{
    if (PyTuple_GET_SIZE(attributes) != F_COUNT) {
        PyErr_SetString(PyExc_ValueError, "a Message has 12 attributes");
        return 0;
    }
    return 1;
}

static PyObject *
envelope(PyObject *module, PyObject *args)
{
    NativeState *st = native_state(module);
    if (st == NULL)
        return NULL;
    PyObject *value, *version, *fields, *intents, *signature, *message, *attributes;
    PyTypeObject *uri_type, *symbol_type;
    if (!PyArg_ParseTuple(args, "OOO!O!OO!O!O!O!", &value, &version, &PyDict_Type, &fields,
                          &PyDict_Type, &intents, &signature, &PyType_Type, &message,
                          &PyTuple_Type, &attributes, &PyType_Type, &uri_type,
                          &PyType_Type, &symbol_type) || !message_attributes_ok(attributes))
        return NULL;
    return envelope_of(st, value, version, fields, intents, signature, message, attributes,
                       uri_type, symbol_type, NULL);
}

/* schema_valid(pairs, body, has_heads) -> True | False | None: the C twin of the schema
 * check (cbcl.protocol._schema._explain, the reference, which also names the violation)
 * over a body whose heads record_for matched to the record `pairs` is of (its _Pairs). It reads the same prepared structures: each _Pairs' slots (open,
 * start, head, heads, first, table, other, required: its `packed` tuple), each _Field (bit, kinds, how, a, b,
 * the next key and _Field), each spec (kinds, how, a, b) and each ListOf's min_length,
 * max_length and _item. True or False as the reference decides (False also for any
 * exception it meets, which check_schema takes as False); None to leave the body
 * to the reference: a type with more than 63 fields (its bits do not fit). */
enum { HOW_PLAIN, HOW_SIZED, HOW_KEYED, HOW_LISTED, HOW_BETWEEN, HOW_AT_LEAST, HOW_AT_MOST,
       HOW_TESTED, HOW_MEMBER, HOW_OPEN };

/* cbcl.protocol._schema._Pairs and its `packed` slot's member descriptor
 * (st->speedups.pairs_type, pairs_packed) are found at the first _Pairs met (NULL: not
 * yet; strong references): its packed tuple is then read through the descriptor, not
 * looked up by name. */

/* pairs.packed: a new reference, or NULL with an exception. */
static PyObject *
packed_of(NativeState *st, PyObject *pairs)
{
    SpeedupsState *sp = &st->speedups;
    PyTypeObject *type = Py_TYPE(pairs);
    if (sp->pairs_type == NULL && strcmp(type->tp_name, "_Pairs") == 0 &&
            (sp->pairs_packed = entry_member(type, "packed")) != NULL)
        sp->pairs_type = (PyTypeObject *)Py_NewRef((PyObject *)type);
    if (type == sp->pairs_type) {
        PyObject *packed = entry_get(sp->pairs_packed, pairs);
        if (packed != NULL)
            return packed;
    }
    return PyObject_GetAttr(pairs, sp->s_packed); /* (unset: the AttributeError) */
}

/* Before a set is hashed into: whether a small exact set or frozenset (at most
 * SMALL_SET_SLOTS slots) holds `key` itself (pointer equality), found by a scan of its
 * slots. 1 when found; 0 when not found that way, which decides nothing (an equal object
 * that is not `key` may be in it): the caller then asks PySet_Contains, so every answer
 * is the one PySet_Contains gives. The schema's kinds are types and its one-of values
 * interned atoms, so the scan finds nearly every valid value (decoder, issue 33). */
#define SMALL_SET_SLOTS 32

static inline int
small_set_has_identical(PyObject *set, PyObject *key)
{
    if (!PyFrozenSet_CheckExact(set) && !PySet_CheckExact(set))
        return 0;
    PySetObject *so = (PySetObject *)set;
    if (so->mask >= SMALL_SET_SLOTS)
        return 0;
    for (Py_ssize_t k = 0; k <= so->mask; k++)
        if (so->table[k].key == key)
            return 1;
    return 0;
}

/* The same for a one-of's set of (type, value) pairs: whether it holds a pair whose items
 * are `type` and `value` themselves (such a pair equals (type, value), so PySet_Contains
 * would find it). 1, or 0 for "not found that way". */
static inline int
small_set_has_pair(PyObject *set, PyObject *type, PyObject *value)
{
    if (!PyFrozenSet_CheckExact(set) && !PySet_CheckExact(set))
        return 0;
    PySetObject *so = (PySetObject *)set;
    if (so->mask >= SMALL_SET_SLOTS)
        return 0;
    for (Py_ssize_t k = 0; k <= so->mask; k++) {
        PyObject *pair = so->table[k].key;
        if (pair != NULL && PyTuple_CheckExact(pair) && PyTuple_GET_SIZE(pair) == 2 &&
                PyTuple_GET_ITEM(pair, 1) == value && PyTuple_GET_ITEM(pair, 0) == type)
            return 1;
    }
    return 0;
}

/* `value` compared with `bound` by `op` (Py_LT or Py_GT) as PyObject_RichCompareBool
 * compares them, without its call where both are exact ints of at most a machine word
 * (bools, subclasses and anything else go to Python's comparison): 1, 0, or -1. */
static inline int
compare_bound(const ValueTypes *vt, PyObject *value, PyObject *bound, int op)
{
    SmallNumber v, w; /* (a Decimal of the checked layout read directly: small_number_of) */
    if (Py_TYPE(value) == (PyTypeObject *)vt->decimal && small_number_of(vt, value, &v) &&
            small_number_of(vt, bound, &w)) {
        int order = small_number_compare(&v, &w);
        return op == Py_LT ? order < 0 : order > 0;
    }
    if (PyLong_CheckExact(value) && PyLong_CheckExact(bound)) {
        int over_v, over_b;
        long long v = PyLong_AsLongLongAndOverflow(value, &over_v);
        long long w = PyLong_AsLongLongAndOverflow(bound, &over_b);
        if (!over_v && !over_b && !((v == -1 || w == -1) && PyErr_Occurred()))
            return op == Py_LT ? v < w : v > w;
        if (PyErr_Occurred())
            PyErr_Clear(); /* (cannot happen for exact ints; Python's comparison decides) */
    }
    return PyObject_RichCompareBool(value, bound, op);
}

/* The children the schema check puts off (a record or keyword list: its _Pairs; a list:
 * its ListOf), last in first out as the lists of (b, value) pairs it had were: `b` a
 * strong reference, `value` borrowed from the body (which the caller holds). */
typedef struct {
    PyObject *b, *value;
} Deferred;

typedef struct {
    Deferred *items;
    Py_ssize_t size, capacity;
    Deferred inline_items[32];
} DeferredStack;

static inline void
deferred_init(DeferredStack *d)
{
    d->items = d->inline_items;
    d->size = 0;
    d->capacity = (Py_ssize_t)(sizeof d->inline_items / sizeof d->inline_items[0]);
}

static void
deferred_free(DeferredStack *d)
{
    for (Py_ssize_t k = 0; k < d->size; k++)
        Py_DECREF(d->items[k].b);
    if (d->items != d->inline_items)
        PyMem_Free(d->items);
    deferred_init(d);
}

/* Put (b, value) on `d`: 0, or -1 with MemoryError. */
static inline int
deferred_push(DeferredStack *d, PyObject *b, PyObject *value)
{
    if (d->size == d->capacity) {
        Py_ssize_t more = 2 * d->capacity;
        Deferred *grown = d->items == d->inline_items ?
            PyMem_Malloc((size_t)more * sizeof *grown) :
            PyMem_Realloc(d->items, (size_t)more * sizeof *grown);
        if (grown == NULL) {
            PyErr_NoMemory();
            return -1;
        }
        if (d->items == d->inline_items)
            memcpy(grown, d->inline_items, sizeof d->inline_items);
        d->items = grown;
        d->capacity = more;
    }
    d->items[d->size].b = Py_NewRef(b);
    d->items[d->size++].value = value;
    return 0;
}

/* Whether `value` passes the spec (kinds, how, a, b): 1, 0, or -1 with an exception; a
 * child to check later goes on `keyed` or `lists` (b, value). */
static int
spec_holds(const ValueTypes *vt, PyObject *kinds, long how, PyObject *a, PyObject *b,
           PyObject *value, DeferredStack *keyed, DeferredStack *lists)
{
    if (kinds != Py_None && !small_set_has_identical(kinds, (PyObject *)Py_TYPE(value))) {
        int in = PySet_Contains(kinds, (PyObject *)Py_TYPE(value));
        if (in <= 0)
            return in;
    }
    switch (how) {
    case HOW_PLAIN:
        return 1;
    case HOW_SIZED: {
        Py_ssize_t length = PyObject_Length(value);
        if (length < 0)
            return -1;
        if (PyTuple_CheckExact(b) && PyTuple_GET_SIZE(b) == 2) { /* (low, stop): a's bounds */
            Py_ssize_t low = PyLong_AsSsize_t(PyTuple_GET_ITEM(b, 0));
            Py_ssize_t stop = PyLong_AsSsize_t(PyTuple_GET_ITEM(b, 1));
            if ((low == -1 || stop == -1) && PyErr_Occurred())
                PyErr_Clear(); /* (not two ints that fit: a's own test below) */
            else
                return low <= length && length < stop;
        }
        PyObject *count = PyLong_FromSsize_t(length);
        if (count == NULL)
            return -1;
        int in = PySequence_Contains(a, count);
        Py_DECREF(count);
        return in;
    }
    case HOW_BETWEEN: {
        int below = compare_bound(vt, value, a, Py_LT);
        if (below != 0)
            return below < 0 ? -1 : 0;
        int above = compare_bound(vt, value, b, Py_GT);
        return above < 0 ? -1 : !above;
    }
    case HOW_AT_LEAST: {
        int below = compare_bound(vt, value, a, Py_LT);
        return below < 0 ? -1 : !below;
    }
    case HOW_AT_MOST: {
        int above = compare_bound(vt, value, b, Py_GT);
        return above < 0 ? -1 : !above;
    }
    case HOW_KEYED:
    case HOW_OPEN: /* (its _Pairs, b, checks any distinct keys as pairs_hold does) */
    case HOW_LISTED: /* (the ListOf's packed spec where _spec_of made one: list_holds) */
        if (how == HOW_LISTED && PyTuple_CheckExact(a) && PyTuple_GET_SIZE(a) == 6)
            b = a;
        return deferred_push(how == HOW_LISTED ? lists : keyed, b, value) < 0 ? -1 : 1;
    case HOW_MEMBER: {
        if (small_set_has_pair(a, (PyObject *)Py_TYPE(value), value))
            return 1;
        PyObject *pair = PyTuple_Pack(2, (PyObject *)Py_TYPE(value), value);
        if (pair == NULL)
            return -1;
        int in = PySet_Contains(a, pair);
        Py_DECREF(pair);
        return in;
    }
    case HOW_TESTED: {
        PyObject *holds = PyObject_CallOneArg(a, value);
        if (holds == NULL)
            return -1;
        int truth = PyObject_IsTrue(holds);
        Py_DECREF(holds);
        return truth;
    }
    default:
        PyErr_SetString(PyExc_ValueError, "unknown spec");
        return -1;
    }
}

/* An unsigned bit set from a Python int: 1, 0 if it does not fit in 63 bits, -1. */
static int
bits_of(PyObject *number, unsigned long long *bits)
{
    if (!PyLong_Check(number))
        return 0;
    int overflow;
    long long v = PyLong_AsLongLongAndOverflow(number, &overflow);
    if (v == -1 && PyErr_Occurred())
        return -1;
    if (overflow || v < 0)
        return 0;
    *bits = (unsigned long long)v;
    return 1;
}

#define OTHERS_INLINE 8

/* The fast pass over one list of keyword-argument pairs (after `start` heads): 1, 0,
 * -1 with an exception, 2 to leave the body to the Python pass. */
static int
pairs_hold(NativeState *st, PyObject *pairs, PyObject *items, int is_body,
           PyObject *has_heads, DeferredStack *keyed, DeferredStack *lists)
{
    int result = -1;
    PyObject *packed = NULL, *others = NULL;
    PyObject *inline_others[OTHERS_INLINE];
    Py_ssize_t n_others = 0;
    Py_ssize_t n = PyTuple_GET_SIZE(items), start;
    unsigned long long seen = 0, required;
    /* (open, start, head, heads, first, table, other, required): _Pairs.packed */
    if ((packed = packed_of(st, pairs)) == NULL)
        goto done;
    if (!PyTuple_CheckExact(packed) || PyTuple_GET_SIZE(packed) != 8) {
        PyErr_SetString(PyExc_TypeError, "not a _Pairs");
        goto done;
    }
    PyObject *head = PyTuple_GET_ITEM(packed, 2), *heads = PyTuple_GET_ITEM(packed, 3),
             *first = PyTuple_GET_ITEM(packed, 4), *table = PyTuple_GET_ITEM(packed, 5),
             *other = PyTuple_GET_ITEM(packed, 6), *required_obj = PyTuple_GET_ITEM(packed, 7);
    start = PyLong_AsSsize_t(PyTuple_GET_ITEM(packed, 1));
    if (start == -1 && PyErr_Occurred())
        goto done;
    if (start) {
        if (n < start) {
            result = 0;
            goto done;
        }
        if (!is_body) {
            if (PyTuple_GET_ITEM(items, 0) != head) {
                PyObject *has = PyObject_CallFunctionObjArgs(has_heads, items, heads, NULL);
                if (has == NULL)
                    goto done;
                int truth = PyObject_IsTrue(has);
                Py_DECREF(has);
                if (truth <= 0) {
                    result = truth;
                    goto done;
                }
            }
        }
    }
    if ((n - start) % 2) {
        result = 0;
        goto done;
    }
    if (!PyTuple_CheckExact(first) || PyTuple_GET_SIZE(first) != 2 ||
            !PyDict_Check(table)) {
        PyErr_SetString(PyExc_TypeError, "not a _Pairs");
        goto done;
    }
    int fits = bits_of(required_obj, &required);
    if (fits <= 0) {
        result = fits < 0 ? -1 : 2;
        goto done;
    }
    PyObject *expected = PyTuple_GET_ITEM(first, 0), *following = PyTuple_GET_ITEM(first, 1);
    for (Py_ssize_t i = start; i < n; i += 2) {
        PyObject *key = PyTuple_GET_ITEM(items, i), *entry, *kinds, *a, *b;
        unsigned long long bit = 0;
        long how;
        if (key == expected) {
            entry = following;
        } else if (Py_TYPE(key) != st->values.inert[1]) { /* not a Keyword (before hashing it) */
            result = 0;
            goto done;
        } else if ((entry = PyDict_GetItemWithError(table, key)) == NULL) {
            if (PyErr_Occurred())
                goto done;
        }
        if (entry != NULL) {
            if (!PyTuple_CheckExact(entry) || PyTuple_GET_SIZE(entry) != 7) {
                PyErr_SetString(PyExc_TypeError, "not a _Field");
                goto done;
            }
            fits = bits_of(PyTuple_GET_ITEM(entry, 0), &bit);
            if (fits <= 0) {
                result = fits < 0 ? -1 : 2;
                goto done;
            }
            kinds = PyTuple_GET_ITEM(entry, 1);
            how = PyLong_AsLong(PyTuple_GET_ITEM(entry, 2));
            a = PyTuple_GET_ITEM(entry, 3);
            b = PyTuple_GET_ITEM(entry, 4);
            expected = PyTuple_GET_ITEM(entry, 5);
            following = PyTuple_GET_ITEM(entry, 6);
        } else {
            if (other == Py_None) {
                result = 0; /* not allowed */
                goto done;
            }
            /* (the first OTHERS_INLINE told apart by a scan, borrowed from `items`; past
             * that, a set of them all) */
            int again = 0;
            if (others != NULL) {
                again = PySet_Contains(others, key);
            } else {
                for (Py_ssize_t k = 0; k < n_others && !again; k++)
                    again = same_atom(inline_others[k], key);
            }
            if (again != 0) {
                result = again < 0 ? -1 : 0; /* repeated */
                goto done;
            }
            if (others == NULL && n_others == OTHERS_INLINE) {
                if ((others = PySet_New(NULL)) == NULL)
                    goto done;
                for (Py_ssize_t k = 0; k < n_others; k++)
                    if (PySet_Add(others, inline_others[k]) < 0)
                        goto done;
            }
            if (others != NULL) {
                if (PySet_Add(others, key) < 0)
                    goto done;
            } else {
                inline_others[n_others++] = key;
            }
            if (!PyTuple_CheckExact(other) || PyTuple_GET_SIZE(other) != 4) {
                PyErr_SetString(PyExc_TypeError, "not a spec");
                goto done;
            }
            kinds = PyTuple_GET_ITEM(other, 0);
            how = PyLong_AsLong(PyTuple_GET_ITEM(other, 1));
            a = PyTuple_GET_ITEM(other, 2);
            b = PyTuple_GET_ITEM(other, 3);
        }
        if (how == -1 && PyErr_Occurred())
            goto done;
        if (seen & bit) {
            result = 0; /* repeated */
            goto done;
        }
        seen |= bit;
        int holds = spec_holds(&st->values, kinds, how, a, b, PyTuple_GET_ITEM(items, i + 1), keyed,
                               lists);
        if (holds <= 0) {
            result = holds;
            goto done;
        }
    }
    result = (seen & required) == required;
done:
    Py_XDECREF(packed);
    Py_XDECREF(others);
    return result;
}

/* The fast pass over one list-of and its `items`: 1, 0, or -1 with an exception. `t` is
 * the ListOf's spec as cbcl.protocol._schema._spec_of packs it, (min_length, max_length,
 * kinds, how, a, b) of its elements, or (another object) the ListOf itself, read by name. */
static int
list_holds(NativeState *st, PyObject *t, PyObject *items, DeferredStack *keyed,
           DeferredStack *lists)
{
    Py_ssize_t n = PyTuple_GET_SIZE(items);
    PyObject *bounds[2], *spec = NULL;
    int packed = PyTuple_CheckExact(t) && PyTuple_GET_SIZE(t) == 6;
    if (packed) {
        bounds[0] = Py_NewRef(PyTuple_GET_ITEM(t, 0));
        bounds[1] = Py_NewRef(PyTuple_GET_ITEM(t, 1));
    } else {
        bounds[0] = PyObject_GetAttr(t, st->speedups.s_min_length);
        bounds[1] = bounds[0] == NULL ? NULL : PyObject_GetAttr(t, st->speedups.s_max_length);
        if (bounds[1] == NULL) {
            Py_XDECREF(bounds[0]);
            return -1;
        }
    }
    int result = -1;
    for (int k = 0; k < 2; k++) {
        PyObject *bound = bounds[k];
        if (bound == Py_None)
            continue;
        int beyond;
        long long limit;
        int overflow = 1;
        if (PyLong_CheckExact(bound)) {
            limit = PyLong_AsLongLongAndOverflow(bound, &overflow);
            if (limit == -1 && PyErr_Occurred()) {
                PyErr_Clear();
                overflow = 1;
            }
        }
        if (!overflow) {
            beyond = k == 0 ? (long long)n < limit : (long long)n > limit;
        } else { /* compared as Python compares (a hand-built bound) */
            PyObject *count = PyLong_FromSsize_t(n);
            beyond = count == NULL ? -1 :
                PyObject_RichCompareBool(count, bound, k == 0 ? Py_LT : Py_GT);
            Py_XDECREF(count);
        }
        if (beyond != 0) {
            result = beyond < 0 ? -1 : 0;
            goto done;
        }
    }
    PyObject *kinds, *a, *b, *how_obj;
    if (packed) {
        kinds = PyTuple_GET_ITEM(t, 2);
        how_obj = PyTuple_GET_ITEM(t, 3);
        a = PyTuple_GET_ITEM(t, 4);
        b = PyTuple_GET_ITEM(t, 5);
    } else {
        spec = PyObject_GetAttr(t, st->speedups.s_item);
        if (spec == NULL)
            goto done;
        if (!PyTuple_CheckExact(spec) || PyTuple_GET_SIZE(spec) != 4) {
            PyErr_SetString(PyExc_TypeError, "not a spec");
            goto done;
        }
        kinds = PyTuple_GET_ITEM(spec, 0);
        how_obj = PyTuple_GET_ITEM(spec, 1);
        a = PyTuple_GET_ITEM(spec, 2);
        b = PyTuple_GET_ITEM(spec, 3);
    }
    long how = PyLong_AsLong(how_obj);
    if (how == -1 && PyErr_Occurred())
        goto done;
    result = 1;
    if (kinds == Py_None && how == HOW_PLAIN)
        goto done;
    for (Py_ssize_t j = 0; j < n; j++) {
        int holds = spec_holds(&st->values, kinds, how, a, b, PyTuple_GET_ITEM(items, j), keyed,
                               lists);
        if (holds <= 0) {
            result = holds;
            goto done;
        }
    }
done:
    Py_DECREF(bounds[0]);
    Py_DECREF(bounds[1]);
    Py_XDECREF(spec);
    return result;
}

/* schema_valid's work, its arguments checked: 1 or 0 (valid or not), 2 to leave the body
 * to the Python pass, -1 with an exception the Python pass would not catch either. */
static int
schema_holds(NativeState *st, PyObject *pairs, PyObject *body, PyObject *has_heads)
{
    PyObject *packed = packed_of(st, pairs);
    if (packed == NULL)
        goto failed;
    if (!PyTuple_CheckExact(packed) || PyTuple_GET_SIZE(packed) != 8) {
        Py_DECREF(packed);
        return 0; /* not a _Pairs: the explaining pass judges */
    }
    /* A record of any keys (`open`, the Python pass's predicate) is checked by the loop
     * of pairs_hold like any other: it has no fields and `other` takes any value, so it
     * holds exactly when the predicate does (distinct keywords, each with a value). */
    Py_DECREF(packed);
    DeferredStack keyed, lists;
    deferred_init(&keyed);
    deferred_init(&lists);
    PyObject *items = body;
    int result = -1;
    Py_INCREF(pairs);
    for (;;) {
        result = pairs_hold(st, pairs, items, items == body, has_heads, &keyed, &lists);
        Py_DECREF(pairs);
        pairs = NULL;
        if (result != 1)
            goto done;
        while (keyed.size == 0) {
            if (lists.size == 0)
                goto done; /* result 1 */
            Deferred list = lists.items[--lists.size];
            result = PyTuple_Check(list.value) ?
                list_holds(st, list.b, list.value, &keyed, &lists) : 0;
            Py_DECREF(list.b);
            if (result != 1)
                goto done;
        }
        Deferred record = keyed.items[--keyed.size];
        pairs = record.b; /* (its reference, given to pairs_hold's turn above) */
        items = record.value;
        if (!PyTuple_Check(items)) {
            Py_DECREF(pairs);
            result = 0;
            goto done;
        }
    }
done:
    deferred_free(&keyed);
    deferred_free(&lists);
    if (result >= 0)
        return result;
failed: /* an exception the Python pass would raise too: the explaining pass judges */
    if (PyErr_ExceptionMatches(PyExc_Exception)) {
        PyErr_Clear();
        return 0;
    }
    return -1;
}

static PyObject *
schema_valid(PyObject *module, PyObject *args)
{
    NativeState *st = native_state(module);
    if (st == NULL)
        return NULL;
    PyObject *pairs, *body, *has_heads;
    if (!PyArg_ParseTuple(args, "OO!O", &pairs, &PyTuple_Type, &body, &has_heads))
        return NULL;
    int holds = schema_holds(st, pairs, body, has_heads);
    if (holds == 2)
        Py_RETURN_NONE;
    return holds < 0 ? NULL : PyBool_FromLong(holds);
}

/* ------------------------------------------------------------------------- acceptance */

/* A protocol's acceptance plan (cbcl.protocol._protocol.Protocol.acceptance, made once at load):
 * what pass 2 needs of it, each found without a Python call.
 *   governed       tuple of the Intent members the grammar judges (compared by identity)
 *   entries        tuple of (Intent, start terminal); () where one start rule serves all
 *   body_terminal  the start terminal of `body`, or None
 *   automaton      the StackAutomaton (its `start` is read at each use: a flush moves it)
 *   step           automaton.step, bound once
 *   atoms          Protocol.atoms (grammar literal atom -> its terminal)
 *   sole, candidates  the schema's records by head (cbcl.protocol._schema.Schema.record_index:
 *                  head -> _Pairs of the only record it can start; head -> ((_Pairs,
 *                  heads), ...) to try in order), or None and None without a schema */
enum { P_GOVERNED, P_ENTRIES, P_BODY_TERMINAL, P_AUTOMATON, P_STEP, P_ATOMS, P_SOLE,
       P_CANDIDATES, P_SIZE };


/* Whether `plan` is an acceptance plan: 1, or 0 with TypeError. */
static int
acceptance_ok(PyObject *plan)
{
    if (!PyTuple_CheckExact(plan) || PyTuple_GET_SIZE(plan) != P_SIZE ||
            !PyTuple_CheckExact(PyTuple_GET_ITEM(plan, P_GOVERNED)) ||
            !PyTuple_CheckExact(PyTuple_GET_ITEM(plan, P_ENTRIES)) ||
            !PyDict_CheckExact(PyTuple_GET_ITEM(plan, P_ATOMS))) {
        PyErr_SetString(PyExc_TypeError, "a protocol's acceptance plan is misshapen");
        return 0;
    }
    return 1;
}

/* The protocol's plan (a new reference), or NULL with TypeError for one misshapen. */
static PyObject *
plan_of(NativeState *st, PyObject *protocol)
{
    PyObject *plan = PyObject_GetAttr(protocol, st->speedups.s_acceptance);
    if (plan != NULL && !acceptance_ok(plan))
        Py_CLEAR(plan);
    return plan;
}

/* The node a body of `intent` starts from (cbcl.protocol._pass2.start_node): a new reference;
 * Py_None where the grammar has no rule for it or refuses its start terminal; NULL with an
 * exception. */
static PyObject *
start_of(NativeState *st, PyObject *plan, PyObject *intent, PyObject *refused)
{
    PyObject *node = PyObject_GetAttr(PyTuple_GET_ITEM(plan, P_AUTOMATON),
                                      st->speedups.s_start);
    if (node == NULL)
        return NULL;
    PyObject *entries = PyTuple_GET_ITEM(plan, P_ENTRIES);
    if (PyTuple_GET_SIZE(entries) > 0) {
        PyObject *terminal = PyTuple_GET_ITEM(plan, P_BODY_TERMINAL);
        for (Py_ssize_t k = 0; k < PyTuple_GET_SIZE(entries); k++) {
            PyObject *entry = PyTuple_GET_ITEM(entries, k);
            if (PyTuple_CheckExact(entry) && PyTuple_GET_SIZE(entry) == 2 &&
                    PyTuple_GET_ITEM(entry, 0) == intent) {
                terminal = PyTuple_GET_ITEM(entry, 1);
                break;
            }
        }
        if (terminal == Py_None) {
            Py_DECREF(node);
            Py_RETURN_NONE;
        }
        Py_INCREF(terminal);
        PyObject *next = PyDict_CheckExact(node) ?
            transition(node, terminal, PyTuple_GET_ITEM(plan, P_STEP)) : NULL;
        Py_DECREF(terminal);
        Py_DECREF(node);
        if (next == NULL)
            return PyErr_Occurred() ? NULL : Py_NewRef(Py_None);
        node = next;
    }
    if (node == refused || !PyDict_CheckExact(node)) {
        Py_DECREF(node);
        Py_RETURN_NONE;
    }
    return node;
}

/* The schema's verdict on a body its grammar accepted (cbcl.protocol._schema.check_schema: the
 * record record_for finds, then the fast pass): 1 valid or unconstrained, 0 to leave it to
 * the Python path (which raises SchemaError, or takes a type this pass leaves to it), -1
 * with an exception. */
static int
schema_accepts(NativeState *st, PyObject *plan, PyObject *body, PyObject *has_heads,
               PyTypeObject *symbol_type)
{
    PyObject *sole = PyTuple_GET_ITEM(plan, P_SOLE);
    PyObject *candidates = PyTuple_GET_ITEM(plan, P_CANDIDATES);
    if (sole == Py_None || !PyTuple_CheckExact(body) || PyTuple_GET_SIZE(body) == 0 ||
            Py_TYPE(PyTuple_GET_ITEM(body, 0)) != symbol_type)
        return 1; /* no schema, or no record can match: unconstrained */
    if (!PyDict_CheckExact(sole) || !PyDict_CheckExact(candidates)) {
        PyErr_SetString(PyExc_TypeError, "a schema's records by head must be dicts");
        return -1;
    }
    PyObject *head = PyTuple_GET_ITEM(body, 0);
    PyObject *pairs = PyDict_GetItemWithError(sole, head);
    if (pairs == NULL) {
        if (PyErr_Occurred())
            return -1;
        PyObject *tried = PyDict_GetItemWithError(candidates, head);
        if (tried == NULL)
            return PyErr_Occurred() ? -1 : 1;
        if (!PyTuple_CheckExact(tried)) {
            PyErr_SetString(PyExc_TypeError, "a head's candidates must be a tuple");
            return -1;
        }
        for (Py_ssize_t k = 0; k < PyTuple_GET_SIZE(tried) && pairs == NULL; k++) {
            PyObject *candidate = PyTuple_GET_ITEM(tried, k), *heads;
            if (!PyTuple_CheckExact(candidate) || PyTuple_GET_SIZE(candidate) != 2 ||
                    !PyTuple_CheckExact(heads = PyTuple_GET_ITEM(candidate, 1))) {
                PyErr_SetString(PyExc_TypeError, "a candidate must be (pairs, heads)");
                return -1;
            }
            Py_ssize_t count = PyTuple_GET_SIZE(heads), i;
            if (PyTuple_GET_SIZE(body) < count)
                continue;
            for (i = 0; i < count; i++) { /* _starts_with: each a Symbol equal to its head */
                PyObject *item = PyTuple_GET_ITEM(body, i), *want = PyTuple_GET_ITEM(heads, i);
                if (item == want)
                    continue;
                if (Py_TYPE(item) != symbol_type || !PyUnicode_Check(want))
                    break;
                int same = PyUnicode_Compare(item, want);
                if (same == -1 && PyErr_Occurred())
                    return -1;
                if (same != 0)
                    break;
            }
            if (i == count)
                pairs = PyTuple_GET_ITEM(candidate, 0);
        }
        if (pairs == NULL)
            return 1;
    }
    Py_INCREF(pairs);
    int holds = schema_holds(st, pairs, body, has_heads);
    Py_DECREF(pairs);
    return holds < 0 ? -1 : holds == 1;
}

/* Whether `plan` governs `intent` (an Intent member: compared by identity). */
static int
governs(PyObject *plan, PyObject *intent)
{
    PyObject *governed = PyTuple_GET_ITEM(plan, P_GOVERNED);
    for (Py_ssize_t k = 0; k < PyTuple_GET_SIZE(governed); k++)
        if (PyTuple_GET_ITEM(governed, k) == intent)
            return 1;
    return 0;
}

/* Pass 2 of a message whose intent and body the envelope gave (cbcl.protocol._pass2
 * .check_intent_and_body, accepting): 1 when the intent is governed and its body present,
 * accepted by the grammar and valid by the schema; 0 for anything else, left to the
 * Python path (which accepts a NOT-UNDERSTOOD or CANCEL the protocol does not govern, or
 * raises the precise error); -1 with an exception. With `why`, a refusal by the grammar
 * is noted there as refusal_of reports it (the walk is the same). */
static int
body_accepted(NativeState *st, PyObject *plan, PyObject *intent, PyObject *body,
              PyObject *terminals,
              PyObject *refused, PyObject *accept, PyObject *has_heads,
              PyTypeObject *symbol_type, BodyRefusal *why)
{
    if (!governs(plan, intent) || body == NULL || body == Py_None)
        return 0;
    PyObject *node = start_of(st, plan, intent, refused);
    if (node == NULL)
        return -1;
    if (node == Py_None) {
        Py_DECREF(node);
        return 0;
    }
    int ok = walk(st, body, node, PyTuple_GET_ITEM(plan, P_ATOMS), terminals,
                  PyTuple_GET_ITEM(plan, P_STEP), refused, accept, why);
    Py_DECREF(node);
    if (ok != 1)
        return ok;
    return schema_accepts(st, plan, body, has_heads, symbol_type);
}

/* body_accepted for outgoing.c (native.h): the protocol's plan, then its walk. */
CBCL_INTERNAL int
cbcl_pass2_accepts(NativeState *st, PyObject *protocol, PyObject *intent, PyObject *body,
                   PyObject *terminals, PyObject *refused, PyObject *accept,
                   PyObject *has_heads, PyTypeObject *symbol_type)
{
    PyObject *plan = plan_of(st, protocol);
    if (plan == NULL)
        return -1;
    int ok = body_accepted(st, plan, intent, body, terminals, refused, accept, has_heads,
                           symbol_type, NULL);
    Py_DECREF(plan);
    return ok;
}

/* accept_document(value, tables, protocols) -> Message | None: both passes over a document
 * value as read (cbcl.protocol._api.accept_document_python is the twin): the envelope (as
 * envelope), its protocol found in `protocols` (a Registry's dict of loaded protocols by
 * id), then pass 2 by the protocol's acceptance plan. `tables`: envelope's arguments after
 * the value, then the atoms' terminals (ATOM_TERMINALS), the automaton's REFUSED and
 * ACCEPT, and cbcl.protocol._schema._has_heads. None for anything the Python path must judge. */
enum { T_VERSION, T_FIELDS, T_INTENTS, T_SIGNATURE, T_MESSAGE, T_ATTRIBUTES, T_URI, T_SYMBOL,
       T_TERMINALS, T_REFUSED, T_ACCEPT, T_HAS_HEADS, T_SIZE };
enum { O_INTENT = 3, O_PROTOCOL = 4, O_BODY = 10, O_SIGNATURE = 11 };

/* Whether `tables` is as accept_document takes it: 1, or 0 with TypeError. */
static int
tables_ok(PyObject *tables)
{
    if (!PyTuple_CheckExact(tables) || PyTuple_GET_SIZE(tables) != T_SIZE ||
            !PyDict_CheckExact(PyTuple_GET_ITEM(tables, T_FIELDS)) ||
            !PyDict_CheckExact(PyTuple_GET_ITEM(tables, T_INTENTS)) ||
            !PyType_Check(PyTuple_GET_ITEM(tables, T_MESSAGE)) ||
            !PyTuple_CheckExact(PyTuple_GET_ITEM(tables, T_ATTRIBUTES)) ||
            PyTuple_GET_SIZE(PyTuple_GET_ITEM(tables, T_ATTRIBUTES)) != F_COUNT ||
            !PyType_Check(PyTuple_GET_ITEM(tables, T_URI)) ||
            !PyType_Check(PyTuple_GET_ITEM(tables, T_SYMBOL)) ||
            !PyDict_CheckExact(PyTuple_GET_ITEM(tables, T_TERMINALS))) {
        PyErr_SetString(PyExc_TypeError, "accept_document's tables are misshapen");
        return 0;
    }
    return 1;
}

/* accept_document's work: the Message, None, or NULL with an exception; *is_signed is set
 * when a Message with a signature is returned; with `why`, where the grammar refused the
 * body (None returned) is noted there (body_accepted). */
static PyObject *
accept_document_of(NativeState *st, PyObject *value, PyObject *tables, PyObject *protocols,
                   int *is_signed, BodyRefusal *why)
{
    if (!tables_ok(tables))
        return NULL;
    if (!PyDict_CheckExact(protocols)) {
        PyErr_SetString(PyExc_TypeError, "protocols must be a dict");
        return NULL;
    }
    PyObject *const *t = &PyTuple_GET_ITEM(tables, 0);
    PyTypeObject *symbol_type = (PyTypeObject *)t[T_SYMBOL];
    PyObject *fields[F_COUNT] = {NULL};
    PyObject *message = envelope_of(st, value, t[T_VERSION], t[T_FIELDS], t[T_INTENTS],
                                    t[T_SIGNATURE], t[T_MESSAGE], t[T_ATTRIBUTES],
                                    (PyTypeObject *)t[T_URI], symbol_type, fields);
    if (message == NULL || message == Py_None)
        return message;
    PyObject *protocol = PyDict_GetItemWithError(protocols, fields[O_PROTOCOL]);
    if (protocol == NULL) {
        if (PyErr_Occurred()) {
            Py_DECREF(message);
            return NULL;
        }
        Py_DECREF(message);
        Py_RETURN_NONE;
    }
    Py_INCREF(protocol);
    PyObject *plan = plan_of(st, protocol);
    Py_DECREF(protocol);
    if (plan == NULL) {
        Py_DECREF(message);
        return NULL;
    }
    int ok = body_accepted(st, plan, fields[O_INTENT], fields[O_BODY], t[T_TERMINALS],
                           t[T_REFUSED], t[T_ACCEPT], t[T_HAS_HEADS], symbol_type, why);
    Py_DECREF(plan);
    if (ok != 1) {
        Py_DECREF(message);
        if (ok < 0)
            return NULL;
        Py_RETURN_NONE;
    }
    *is_signed = fields[O_SIGNATURE] != NULL;
    return message;
}

static PyObject *
accept_document(PyObject *module, PyObject *const *args, Py_ssize_t nargs)
{
    NativeState *st = native_state(module);
    if (st == NULL)
        return NULL;
    if (nargs != 3) {
        PyErr_SetString(PyExc_TypeError, "accept_document(value, tables, protocols)");
        return NULL;
    }
    int is_signed = 0;
    return accept_document_of(st, args[0], args[1], args[2], &is_signed, NULL);
}

/* ------------------------------------------------------------------------- decode_frame */

/* decode_frame(data, state) -> Message | None: a whole binary frame decoded and recognised
 * in one call (cbcl.binary._codec.Decoder.decode's fast path; its Python twin is _fast_frame):
 * the header, its protocol's frame plan, the envelope (read_frame_envelope), the limits
 * the envelope's text would meet, the body (build_body_of, which runs the grammar) and the
 * schema (schema_accepts), then the Message. `state` is the decoder's FrameState (below;
 * Decoder._frame_state); a frame plan (cbcl.binary._codec._Memos.frame_plans, by the
 * digest's 32 bytes) is (protocol, its id, the id's length, the symbol table's entry_list
 * and codes, the protocol's acceptance plan). None for anything else: a short id, a
 * digest without a plan, a protocol no longer loaded under that id, an intent the
 * protocol does not govern, any doubt the careful decoder must judge. */
enum { FP_PROTOCOL, FP_ID, FP_ID_LENGTH, FP_ENTRIES, FP_CODES, FP_ACCEPTANCE, FP_SIZE };
enum { HEADER_BYTES = 36, HAS_BODY = 32 };

/* cbcl._native.FrameState: what decode_frame reads with each frame of a decoder, made
 * once per decoder (cbcl.binary._codec._frame_state) by keyword, each field checked here,
 * so decode_frame reads them by name and the limits as C integers. Immutable (its fields
 * are read-only attributes, for the tests); the dicts in it are shared with the memos and
 * the registry, which change them in place. A heap type of the module (module.c's exec),
 * with the cyclic collector: a state refers to its memos (keep) and they may to it. */
typedef struct {
    PyObject_HEAD
    PyObject *frame_plans;    /* dict: the memos' frame plans by digest */
    PyObject *protocols;      /* dict: the registry's loaded protocols by id */
    PyObject *intents;        /* tuple: the Intent members by wire index */
    PyObject *intent_lengths; /* tuple of int: each intent's name's length */
    PyObject *shapes;         /* bytes[128]: by presence bits, 1 where the limits hold */
    PyObject *uris;           /* dict: the memos' URI memo */
    PyObject *caches;         /* tuple: the memos' atom caches by token code */
    PyObject *keep;           /* callable: the memos' keep(code, text) */
    PyObject *envelope_nodes; /* tuple[64] of int: the envelope's nodes by presence bits */
    PyObject *refused, *accept, *has_heads; /* the automaton's outcomes, the head test */
    PyObject *symbol, *message, *signature; /* types */
    PyObject *attributes;     /* tuple: Message's 11 attribute names, in grammar order */
    PyObject *refusal;        /* callable: raises the error of a refused body (below) */
    Py_ssize_t memo_entries, max_message_bytes, max_string_bytes, max_body_depth,
               max_list_items, max_name_chars, max_nodes;
    /* decode_frame's own: the digest of the last frame's table and its plan (a frame's
     * peer sends one protocol after another: the plan found again without making the
     * digest's bytes and hashing them), NULL until a frame has a plan */
    PyObject *last_digest, *last_plan;
    /* with last_plan: a bit per hash (mod 256) of the atoms of its table's codes, so that
     * build_body_of asks the codes dict about a learned atom only where one may be there
     * (a table's codes never change once made) */
    uint64_t code_bloom[4];
} FrameState;


#define FS_OBJECTS(X) X(frame_plans) X(protocols) X(intents) X(intent_lengths) X(shapes) \
    X(uris) X(caches) X(keep) X(envelope_nodes) X(refused) X(accept) X(has_heads) \
    X(symbol) X(message) X(signature) X(attributes) X(refusal)

static PyObject *
frame_state_new(PyTypeObject *type, PyObject *args, PyObject *kwargs)
{
    static const char *const names[] = {
        "frame_plans", "protocols", "intents", "intent_lengths", "shapes", "uris", "caches",
        "keep", "envelope_nodes", "refused", "accept", "has_heads", "symbol", "message",
        "signature", "attributes", "refusal", "memo_entries", "max_message_bytes",
        "max_string_bytes", "max_body_depth", "max_list_items", "max_name_chars", "max_nodes",
        NULL};
    PyObject *o[17] = {NULL};
    Py_ssize_t n[7];
    for (int k = 0; k < 7; k++)
        n[k] = PY_SSIZE_T_MIN; /* (not given) */
    if (PyTuple_GET_SIZE(args) != 0) {
        PyErr_SetString(PyExc_TypeError, "FrameState() takes keyword arguments only");
        return NULL;
    }
    if (!PyArg_ParseTupleAndKeywords(
            args, kwargs, "|$O!O!O!O!O!O!O!OO!OOOO!O!OO!Onnnnnnn:FrameState", (char **)names,
            &PyDict_Type, &o[0], &PyDict_Type, &o[1], &PyTuple_Type, &o[2], &PyTuple_Type,
            &o[3], &PyBytes_Type, &o[4], &PyDict_Type, &o[5], &PyTuple_Type, &o[6], &o[7],
            &PyTuple_Type, &o[8], &o[9], &o[10], &o[11], &PyType_Type, &o[12], &PyType_Type,
            &o[13], &o[14], &PyTuple_Type, &o[15], &o[16], &n[0], &n[1], &n[2], &n[3], &n[4],
            &n[5], &n[6]))
        return NULL;
    for (int k = 0; k < 17; k++)
        if (o[k] == NULL) {
            PyErr_Format(PyExc_TypeError, "FrameState() needs %s", names[k]);
            return NULL;
        }
    for (int k = 0; k < 7; k++)
        if (n[k] == PY_SSIZE_T_MIN) {
            PyErr_Format(PyExc_TypeError, "FrameState() needs %s", names[17 + k]);
            return NULL;
        }
    /* (exact: decode_frame reads them with the macros of their exact types) */
    if (!PyDict_CheckExact(o[0]) || !PyDict_CheckExact(o[1]) || !PyDict_CheckExact(o[5]) ||
            !PyTuple_CheckExact(o[2]) || !PyTuple_CheckExact(o[3]) ||
            !PyTuple_CheckExact(o[6]) || !PyTuple_CheckExact(o[8]) ||
            !PyTuple_CheckExact(o[15]) || !PyBytes_CheckExact(o[4]) ||
            PyTuple_GET_SIZE(o[3]) != PyTuple_GET_SIZE(o[2]) ||
            PyBytes_GET_SIZE(o[4]) < PRESENCES || PyTuple_GET_SIZE(o[8]) < PRESENCES ||
            PyTuple_GET_SIZE(o[15]) != F_COUNT || !PyCallable_Check(o[7]) ||
            !PyCallable_Check(o[11]) || !PyCallable_Check(o[14]) ||
            !PyCallable_Check(o[16])) {
        PyErr_SetString(PyExc_TypeError, "FrameState(): a field of the wrong type or size");
        return NULL;
    }
    FrameState *self = (FrameState *)type->tp_alloc(type, 0);
    if (self == NULL)
        return NULL;
    int k = 0;
#define FS_SET(name) self->name = Py_NewRef(o[k++]);
    FS_OBJECTS(FS_SET)
#undef FS_SET
    self->memo_entries = n[0];
    self->max_message_bytes = n[1];
    self->max_string_bytes = n[2];
    self->max_body_depth = n[3];
    self->max_list_items = n[4];
    self->max_name_chars = n[5];
    self->max_nodes = n[6];
    self->last_digest = self->last_plan = NULL;
    return (PyObject *)self;
}

static int
frame_state_traverse(FrameState *self, visitproc visit, void *arg)
{
    Py_VISIT(Py_TYPE(self)); /* (a heap type's instances keep it) */
#define FS_VISIT(name) Py_VISIT(self->name);
    FS_OBJECTS(FS_VISIT)
#undef FS_VISIT
    Py_VISIT(self->last_digest);
    Py_VISIT(self->last_plan);
    return 0;
}

static int
frame_state_clear(FrameState *self)
{
#define FS_CLEAR(name) Py_CLEAR(self->name);
    FS_OBJECTS(FS_CLEAR)
#undef FS_CLEAR
    Py_CLEAR(self->last_digest);
    Py_CLEAR(self->last_plan);
    return 0;
}

static void
frame_state_dealloc(FrameState *self)
{
    PyTypeObject *type = Py_TYPE(self);
    PyObject_GC_UnTrack(self);
    frame_state_clear(self);
    type->tp_free((PyObject *)self);
    Py_DECREF(type);
}

#define FS_MEMBER(name, kind, doc) \
    {#name, kind, offsetof(FrameState, name), Py_READONLY, doc},
static PyMemberDef frame_state_members[] = {
    FS_MEMBER(frame_plans, Py_T_OBJECT_EX, "the memos' frame plans by digest (dict)")
    FS_MEMBER(protocols, Py_T_OBJECT_EX, "the registry's loaded protocols by id (dict)")
    FS_MEMBER(intents, Py_T_OBJECT_EX, "the Intent members by wire index")
    FS_MEMBER(intent_lengths, Py_T_OBJECT_EX, "each intent's name's length")
    FS_MEMBER(shapes, Py_T_OBJECT_EX, "by presence bits: whether the envelope is within "
              "the limits (64 bytes)")
    FS_MEMBER(uris, Py_T_OBJECT_EX, "the memos' URI memo (dict)")
    FS_MEMBER(caches, Py_T_OBJECT_EX, "the memos' atom caches by token code")
    FS_MEMBER(keep, Py_T_OBJECT_EX, "the memos' keep(code, text)")
    FS_MEMBER(envelope_nodes, Py_T_OBJECT_EX, "the envelope's nodes by presence bits")
    FS_MEMBER(refused, Py_T_OBJECT_EX, "the automaton's REFUSED")
    FS_MEMBER(accept, Py_T_OBJECT_EX, "the automaton's ACCEPT")
    FS_MEMBER(has_heads, Py_T_OBJECT_EX, "the schema's head test")
    FS_MEMBER(symbol, Py_T_OBJECT_EX, "the Symbol type")
    FS_MEMBER(message, Py_T_OBJECT_EX, "the Message type")
    FS_MEMBER(signature, Py_T_OBJECT_EX, "the Signature type")
    FS_MEMBER(attributes, Py_T_OBJECT_EX, "Message's attribute names, in grammar order")
    FS_MEMBER(refusal, Py_T_OBJECT_EX, "raises the error of a body the grammar refuses")
    FS_MEMBER(memo_entries, Py_T_PYSSIZET, "the most entries an atom memo holds")
    FS_MEMBER(max_message_bytes, Py_T_PYSSIZET, "the limits' max_message_bytes")
    FS_MEMBER(max_string_bytes, Py_T_PYSSIZET, "the limits' max_string_bytes")
    FS_MEMBER(max_body_depth, Py_T_PYSSIZET, "the limits' max_depth less the envelope's 2")
    FS_MEMBER(max_list_items, Py_T_PYSSIZET, "the limits' max_list_items")
    FS_MEMBER(max_name_chars, Py_T_PYSSIZET, "the limits' max_name_chars")
    FS_MEMBER(max_nodes, Py_T_PYSSIZET, "the limits' max_nodes")
    {NULL, 0, 0, 0, NULL},
};
#undef FS_MEMBER

static PyType_Slot frame_state_slots[] = {
    {Py_tp_doc, "FrameState(*, frame_plans, protocols, intents, intent_lengths, shapes, "
                "uris, caches, keep, envelope_nodes, refused, accept, has_heads, symbol, "
                "message, signature, attributes, refusal, memo_entries, max_message_bytes, "
                "max_string_bytes, max_body_depth, max_list_items, max_name_chars, "
                "max_nodes): what decode_frame reads with each frame of a decoder "
                "(cbcl.binary._codec._frame_state makes it)."},
    {Py_tp_new, frame_state_new},
    {Py_tp_traverse, frame_state_traverse},
    {Py_tp_clear, frame_state_clear},
    {Py_tp_dealloc, frame_state_dealloc},
    {Py_tp_members, frame_state_members},
    {0, NULL},
};

static PyType_Spec frame_state_spec = {
    .name = "cbcl._native.FrameState",
    .basicsize = sizeof(FrameState),
    .flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_HAVE_GC | Py_TPFLAGS_IMMUTABLETYPE,
    .slots = frame_state_slots,
};

/* decode_frame's work, its data exact bytes: the Message, None, or NULL with an exception;
 * *is_signed is set when a Message with a signature is returned. */
static PyObject *
decode_frame_of(NativeState *st, PyObject *data, PyObject *state_object, int *is_signed)
{
    if (Py_TYPE(state_object) != st->speedups.frame_state_type) {
        PyErr_SetString(PyExc_TypeError, "decode_frame's state must be a FrameState");
        return NULL;
    }
    FrameState *d = (FrameState *)state_object;
    const unsigned char *p = (const unsigned char *)PyBytes_AS_STRING(data);
    Py_ssize_t n = PyBytes_GET_SIZE(data);
    if (n > d->max_message_bytes || n < HEADER_BYTES || p[0] != 0xcb || p[1] != 'L' ||
            p[2] != 1 || p[3] != 0)
        Py_RETURN_NONE; /* (a short id, too: the Python path reads it) */
    /* The plan of the frame's table: the last one again where the digest is the last's
     * (a plan is made of its table, and a table of its protocol: while that protocol is
     * the registry's, checked below, the plan the dict holds for the digest is an equal
     * one), else looked up in the plans and remembered. */
    PyObject *plan = d->last_plan;
    int current = 1; /* (whether plan's protocol is the registry's, checked) */
    if (plan == NULL || memcmp(PyBytes_AS_STRING(d->last_digest), p + 4, 32) != 0 ||
            PyDict_GetItemWithError(d->protocols, PyTuple_GET_ITEM(plan, FP_ID)) !=
                PyTuple_GET_ITEM(plan, FP_PROTOCOL)) {
        if (PyErr_Occurred())
            return NULL;
        PyObject *digest = PyBytes_FromStringAndSize((const char *)p + 4, 32);
        if (digest == NULL)
            return NULL;
        plan = PyDict_GetItemWithError(d->frame_plans, digest);
        if (plan == NULL) {
            Py_DECREF(digest);
            return PyErr_Occurred() ? NULL : Py_NewRef(Py_None);
        }
        if (!PyTuple_CheckExact(plan) || PyTuple_GET_SIZE(plan) != FP_SIZE ||
                !PyTuple_CheckExact(PyTuple_GET_ITEM(plan, FP_ENTRIES)) ||
                !PyDict_CheckExact(PyTuple_GET_ITEM(plan, FP_CODES))) {
            Py_DECREF(digest);
            PyErr_SetString(PyExc_TypeError, "a frame plan is misshapen");
            return NULL;
        }
        Py_XSETREF(d->last_digest, digest);
        Py_XSETREF(d->last_plan, Py_NewRef(plan));
        current = 0;
        PyObject *codes = PyTuple_GET_ITEM(plan, FP_CODES), *key, *code;
        Py_ssize_t at = 0;
        memset(d->code_bloom, 0, sizeof d->code_bloom);
        while (PyDict_Next(codes, &at, &key, &code)) {
            Py_hash_t h = PyObject_Hash(key);
            if (h == -1) { /* (not so: a dict's keys are hashable) every bit set */
                PyErr_Clear();
                memset(d->code_bloom, 0xff, sizeof d->code_bloom);
                break;
            }
            d->code_bloom[((uint64_t)h >> 6) & 3] |= UINT64_C(1) << ((uint64_t)h & 63);
        }
    }
    Py_INCREF(plan); /* the plans may change under a Python call */
    PyObject *slots[ENVELOPE_SLOTS] = {NULL};
    PyObject *acceptance = NULL, *start = NULL, *body = NULL, *signature = NULL;
    PyObject *result = NULL;
    BodyRefusal why = BODY_REFUSAL_INIT;
    Py_ssize_t offset = 0, intent_index = 0;
    long long bits = 0;
    if (!current && PyDict_GetItemWithError(d->protocols, PyTuple_GET_ITEM(plan, FP_ID)) !=
            PyTuple_GET_ITEM(plan, FP_PROTOCOL))
        goto decline; /* (or an exception) */
    int ok = read_frame_envelope(st, p, n, HEADER_BYTES, d->intents, d->uris,
                                 d->max_string_bytes, d->memo_entries, slots, &offset,
                                 &intent_index, &bits);
    if (ok <= 0)
        goto decline;
    /* The limits the envelope's text would meet (cbcl.binary._codec.envelope_limits): its shape
     * by the bits, then the intent's and the protocol id's names. */
    Py_ssize_t intent_length = PyLong_AsSsize_t(
        PyTuple_GET_ITEM(d->intent_lengths, intent_index));
    Py_ssize_t id_length = PyLong_AsSsize_t(PyTuple_GET_ITEM(plan, FP_ID_LENGTH));
    Py_ssize_t envelope_nodes = PyLong_AsSsize_t(
        PyTuple_GET_ITEM(d->envelope_nodes, (Py_ssize_t)bits));
    if (PyErr_Occurred())
        goto decline;
    if (!PyBytes_AS_STRING(d->shapes)[bits] || intent_length > d->max_name_chars ||
            id_length > d->max_name_chars || !(bits & HAS_BODY))
        goto decline; /* (a governed intent needs a body) */
    acceptance = Py_NewRef(PyTuple_GET_ITEM(plan, FP_ACCEPTANCE));
    if (!acceptance_ok(acceptance))
        goto decline;
    if (!governs(acceptance, slots[0]))
        goto decline;
    start = start_of(st, acceptance, slots[0], d->refused);
    if (start == NULL || start == Py_None)
        goto decline;
    body = build_body_of(st, p, n, offset, PyTuple_GET_ITEM(plan, FP_ENTRIES),
                         PyTuple_GET_ITEM(plan, FP_CODES), d->caches, d->keep, start,
                         PyTuple_GET_ITEM(acceptance, P_STEP), d->max_body_depth,
                         d->max_list_items, d->max_string_bytes, d->max_name_chars,
                         d->max_nodes - envelope_nodes, d->refused, d->accept,
                         d->memo_entries, &why, d->code_bloom);
    if (body == NULL || body == Py_None)
        goto decline;
    if (why.kind != BR_NONE) {
        /* The grammar refused a body within every limit of a frame otherwise sound: the
         * error is raised here, worded from where the walk stopped (never walked again). */
        PyObject *raised = PyObject_CallFunction(
            d->refusal, "OOOiOOOOn", PyTuple_GET_ITEM(plan, FP_PROTOCOL), slots[0], body,
            why.kind, why.path, why.node, why.cls, why.frames, why.at);
        if (raised == NULL)
            goto cleanup; /* (result NULL: the error it raised) */
        Py_DECREF(raised);
        goto decline; /* (it declined to word it: the Python decoder will) */
    }
    ok = schema_accepts(st, acceptance, body, d->has_heads, (PyTypeObject *)d->symbol);
    if (ok != 1)
        goto decline;
    if (slots[9] != NULL) {
        signature = new_signature(st, d->signature, slots[9], slots[10]);
        if (signature == NULL)
            goto decline;
    }
    {
        PyObject *values[F_COUNT] = {slots[2], slots[3], slots[4], slots[0],
                                     PyTuple_GET_ITEM(plan, FP_ID), slots[5], slots[6],
                                     slots[7], slots[8], slots[TRACE_SLOT], body,
                                     signature};
        result = new_with_attributes(st, (PyTypeObject *)d->message, d->attributes, values);
        *is_signed = signature != NULL;
    }
    goto cleanup;
decline: /* None, unless an exception is set */
    if (!PyErr_Occurred())
        result = Py_NewRef(Py_None);
cleanup:
    for (int slot = 0; slot < ENVELOPE_SLOTS; slot++)
        Py_XDECREF(slots[slot]);
    Py_XDECREF(acceptance);
    Py_XDECREF(start);
    Py_XDECREF(body);
    Py_XDECREF(signature);
    body_refusal_free(&why);
    Py_DECREF(plan);
    return result;
}

static PyObject *
decode_frame(PyObject *module, PyObject *const *args, Py_ssize_t nargs)
{
    NativeState *st = native_state(module);
    if (st == NULL)
        return NULL;
    if (nargs != 2 || !PyBytes_CheckExact(args[0])) {
        PyErr_SetString(PyExc_TypeError, "decode_frame(data: bytes, state)");
        return NULL;
    }
    int is_signed = 0;
    return decode_frame_of(st, args[0], args[1], &is_signed);
}

/* ------------------------------------------------------------------------- entries */

/* The message of frame `data` decoded with `state` (decode_frame_of; held while Python
 * code may run: a signature's type), through verified(message, registry) (the trust
 * store's check, cbcl.protocol._api._verified) when it is signed or `require`: a new reference,
 * None (declined) or NULL with an exception. What Decoder.decode and the one-shot decode
 * do once they have their state. */
static PyObject *
frame_message(NativeState *st, PyObject *data, PyObject *state, int require,
              PyObject *verified, PyObject *registry)
{
    int is_signed = 0;
    Py_INCREF(state);
    PyObject *message = decode_frame_of(st, data, state, &is_signed);
    Py_DECREF(state);
    if (message == NULL || message == Py_None || (!is_signed && !require))
        return message;
    PyObject *checked = PyObject_CallFunctionObjArgs(verified, message, registry, NULL);
    Py_DECREF(message);
    return checked;
}

/* Decoder.decode as a C method (cbcl/_native_src/entry.h): for one positional argument of exact bytes
 * and a decoder with a frame state (Decoder._frame_state), frame_message with the
 * decoder's registry and require_signatures; with type=C as well, the message then made
 * an instance of C by records.c's cbcl_record_of_decoded. Anything else, or a frame
 * decode_frame or the conversion declines, falls back to the Python method. */
static PyObject *decoder_decode(NativeState *st, PyObject *self, PyObject *const *args,
                                Py_ssize_t nargs, PyObject *kwnames);
static int decoder_bind(NativeState *st, PyTypeObject *owner);
/* (the template of st->speedups.decode_entry; its state beside it: decode_verified,
 * cbcl.protocol._api._verified(message, registry) -> message, and the member descriptors
 * of the slots of cbcl.binary._codec.Decoder decoder_decode reads, strong references,
 * NULL where not found) */
static const CEntry DECODE_ENTRY = {
    {"decode", NULL, METH_FASTCALL | METH_KEYWORDS, NULL}, decoder_decode, decoder_bind,
    NULL, NULL};

/* records.c: a decoded message as an instance of the record class `type`, or None;
 * protocols is the registry's _protocols_by_id() (parse_protocols, below). */
CBCL_INTERNAL PyObject *cbcl_record_of_decoded(NativeState *st, PyObject *type,
                                               PyObject *message, PyObject *protocols);
static PyObject *parse_protocols(SpeedupsState *sp, PyObject *registry, PyObject **fast);

/* cbcl_record_of_decoded for a message decoded with `registry`: None where the registry
 * has no _protocols_by_id (the Python path decides). */
static PyObject *
record_of_decoded(NativeState *st, PyObject *type, PyObject *message, PyObject *registry)
{
    PyObject *fast = NULL;
    PyObject *every = parse_protocols(&st->speedups, registry, &fast);
    if (every == NULL)
        return PyErr_Occurred() ? NULL : Py_NewRef(Py_None);
    Py_INCREF(fast); /* (borrowed from the state, which Python code run below may change) */
    Py_DECREF(every);
    PyObject *made = cbcl_record_of_decoded(st, type, message, fast);
    Py_DECREF(fast);
    return made;
}

static PyObject *
decoder_decode(NativeState *st, PyObject *self, PyObject *const *args, Py_ssize_t nargs,
               PyObject *kwnames)
{
    SpeedupsState *sp = &st->speedups;
    /* (type=C: records.c's cbcl_record_of_decoded converts the message in C) */
    PyObject *record_type = kwnames != NULL && PyTuple_GET_SIZE(kwnames) == 1 &&
        PyUnicode_Compare(PyTuple_GET_ITEM(kwnames, 0), sp->s_type) == 0 ? args[1] : NULL;
    if (nargs == 1 && (kwnames == NULL || record_type != NULL) &&
            sp->decoder_frame_state != NULL && PyBytes_CheckExact(args[0])) {
        PyObject *message = Py_None; /* (borrowed while None: not decoded) */
        PyObject *state = entry_get(sp->decoder_frame_state, self);
        PyObject *require = state == NULL ? NULL : entry_get(sp->decoder_require, self);
        PyObject *registry = require == NULL ? NULL : entry_get(sp->decoder_registry, self);
        if (registry != NULL && state != Py_None) {
            message = frame_message(st, args[0], state, require != Py_False,
                                    sp->decode_verified, registry);
            if (message != NULL && message != Py_None && record_type != NULL &&
                    record_type != Py_None)
                Py_SETREF(message, record_of_decoded(st, record_type, message, registry));
            if (message == Py_None) /* (declined: the Python method decides; its reference
                                     * dropped once, here only) */
                Py_DECREF(message);
        }
        Py_XDECREF(state);
        Py_XDECREF(require);
        Py_XDECREF(registry);
        if (message != Py_None)
            return message; /* (or NULL: an exception) */
    }
    return entry_call_method(&sp->decode_entry, self, args, nargs, kwnames);
}

/* cbcl.parse as a C function (cbcl/_native_src/entry.h): the ordinary call, parse(data,
 * registry=registry) with data exact bytes within the default limits, is what parse's
 * fast path (cbcl.protocol._api._accepted) does, in C: the UTF-8 decoded, the document read by
 * cbcl._native's reader (cbcl_read_value_of), both passes by accept_document_of over every
 * protocol the registry holds. An unsigned message is returned as it is; a signed one goes
 * through parse_verified (the registry's trust store, as parse has it); then, where the
 * message's protocol has constraints (it is not in Registry._protocols_by_id()),
 * parse_constraints(registry, message) applies them
 * (cbcl.protocol._api.check_constraints: the rules stay Python). A document both passes do
 * not accept, read whole and within the limits, goes to parse_declined(value, text,
 * registry, report) (cbcl.protocol._api._declined; report: where the grammar refused the
 * body, as refusal_of reports it, or None): the careful path's continuation from the value
 * read here, which raises the refusal (worded from where this walk stopped, its place in
 * the text found by text_index: no second read or walk), returns the message (one
 * accepted only there), or None to decline. Any other call, or a document declined, falls back to the
 * Python function (which reads it again, to accept it or raise). */
static PyObject *parse_call(PyObject *module, PyObject *const *args, Py_ssize_t nargs,
                            PyObject *kwnames);
/* (the template of st->speedups.parse_entry; its state beside it: parse_entry's arguments,
 * parse_verified(message, registry) -> message, parse_space_after(text, end) -> bool
 * (cbcl.core._reader.only_space_after), accept_document's tables (parse_tables), the
 * reader's token cache and atom maker, the default limits, parse_declined and
 * parse_constraints) */
static const CEntry PARSE_ENTRY = {
    {"parse", (PyCFunction)(void (*)(void))parse_call, METH_FASTCALL | METH_KEYWORDS, NULL},
    NULL, NULL, NULL, NULL};
enum { L_MESSAGE_BYTES, L_DEPTH, L_LIST_ITEMS, L_NODES, L_STRING_BYTES, L_NAME_CHARS,
       L_COUNT };
static_assert(L_COUNT == CBCL_PARSE_LIMITS, "the state's parse_limits: one per limit");

/* The registry parse_fast last served (st->speedups.parse_last_registry, a weak
 * reference; NULL: none yet), its dict of every loaded protocol (parse_last_protocols,
 * Registry._protocols, strong) and of those without constraints (parse_last_fast,
 * Registry._protocols_by_id()): each the same dict for the registry's lifetime, and a
 * Python call per parse would cost more than the C tiers save on a short message. */

/* Whether weak reference `ref` refers to `object` (a dead one refers to nothing). */
static int
refers_to(PyObject *ref, PyObject *object)
{
#if PY_VERSION_HEX >= 0x030D0000
    PyObject *target = NULL;
    if (PyWeakref_GetRef(ref, &target) < 0) {
        PyErr_Clear();
        return 0;
    }
    Py_XDECREF(target); /* (compared by identity only) */
    return target == object;
#else
    return PyWeakref_GetObject(ref) == object; /* (borrowed; Py_None once dead) */
#endif
}

/* registry._protocols (a new reference, a dict) and, in *fast, registry._protocols_by_id()
 * (borrowed from the state: valid until the next call); NULL with no exception for a
 * registry that has none (not a Registry: parse says what it is), NULL with one for an
 * error it raised. */
static PyObject *
parse_protocols(SpeedupsState *sp, PyObject *registry, PyObject **fast)
{
    if (sp->parse_last_registry != NULL && refers_to(sp->parse_last_registry, registry)) {
        *fast = sp->parse_last_fast;
        return Py_NewRef(sp->parse_last_protocols);
    }
    PyObject *protocols = PyObject_CallMethodNoArgs(registry, sp->s_protocols_by_id);
    PyObject *every = protocols == NULL ? NULL : PyObject_GetAttrString(registry, "_protocols");
    if (every == NULL || !PyDict_CheckExact(protocols) || !PyDict_CheckExact(every)) {
        Py_XDECREF(protocols);
        Py_XDECREF(every);
        if (PyErr_Occurred() && !PyErr_ExceptionMatches(PyExc_AttributeError))
            return NULL;
        PyErr_Clear();
        return NULL;
    }
    PyObject *ref = PyWeakref_NewRef(registry, NULL);
    if (ref == NULL) {
        PyErr_Clear(); /* (not weakly referable: not remembered; served once, unchecked) */
        Py_DECREF(protocols);
        Py_DECREF(every);
        return NULL;
    }
    Py_XSETREF(sp->parse_last_registry, ref);
    Py_XSETREF(sp->parse_last_protocols, every);
    Py_XSETREF(sp->parse_last_fast, protocols);
    *fast = protocols;
    return Py_NewRef(every);
}

/* The message of parse_call's ordinary case; None: not that case (or declined). */
static PyObject *
parse_fast(NativeState *st, PyObject *data, PyObject *registry)
{
    SpeedupsState *sp = &st->speedups;
    const Py_ssize_t *limits = sp->parse_limits;
    Py_ssize_t n = PyBytes_GET_SIZE(data);
    if (n > limits[L_MESSAGE_BYTES] || registry == Py_None)
        Py_RETURN_NONE; /* (the careful path says which limit, or what registry is) */
    PyObject *fast = NULL;
    PyObject *protocols = parse_protocols(sp, registry, &fast);
    if (protocols == NULL) {
        if (PyErr_Occurred())
            return NULL;
        Py_RETURN_NONE; /* not a Registry: parse says what it is */
    }
    Py_INCREF(fast); /* (the state's reference may change while Python code runs) */
    /* (a registry with constraints: Registry._constrained, its dicts told apart) */
    int constrained = PyDict_GET_SIZE(fast) < PyDict_GET_SIZE(protocols);
    PyObject *result = NULL, *value = NULL;
    BodyRefusal why = BODY_REFUSAL_INIT; /* (where the grammar refused the body) */
    PyObject *text = PyUnicode_DecodeUTF8(PyBytes_AS_STRING(data), n, NULL);
    if (text == NULL) {
        if (!PyErr_ExceptionMatches(PyExc_UnicodeDecodeError))
            goto cleanup;
        PyErr_Clear();
        goto decline;
    }
    Py_ssize_t end = 0, nodes = 0;
    value = cbcl_read_value_of(st, text, 0, sp->parse_cache, sp->parse_atom, limits[L_DEPTH],
                               limits[L_LIST_ITEMS], limits[L_NODES], limits[L_STRING_BYTES],
                               limits[L_NAME_CHARS], data, &end, &nodes);
    if (value == NULL)
        goto cleanup;
    if (value == Py_None)
        goto decline;
    if (end != PyUnicode_GET_LENGTH(text)) { /* (whitespace or a comment may follow) */
        PyObject *index = PyLong_FromSsize_t(end);
        if (index == NULL)
            goto cleanup;
        PyObject *only = PyObject_CallFunctionObjArgs(sp->parse_space_after, text, index, NULL);
        Py_DECREF(index);
        if (only == NULL)
            goto cleanup;
        int blank = PyObject_IsTrue(only);
        Py_DECREF(only);
        if (blank < 0)
            goto cleanup;
        if (!blank)
            goto decline;
    }
    int is_signed = 0;
    PyObject *message = accept_document_of(st, value, sp->parse_tables, protocols, &is_signed,
                                           &why);
    if (message == NULL)
        goto cleanup;
    if (message == Py_None) { /* the careful continuation, from the value read here */
        Py_DECREF(message);
        PyObject *report = why.kind == BR_NONE ? Py_NewRef(Py_None) : Py_BuildValue(
            "(iOOOO)", why.kind, why.path, why.node, why.cls, why.frames);
        if (report == NULL)
            goto cleanup;
        result = PyObject_CallFunctionObjArgs(sp->parse_declined, value, text, registry,
                                              report, NULL);
        Py_DECREF(report);
        goto cleanup;
    }
    /* Its protocol has constraints where the registry's dict of those without does not
     * hold it (the message is accept_document_of's: a MessageFields instance). */
    int ruled = 0;
    if (constrained) {
        PyObject *id = ((MessageFieldsObject *)message)->protocol;
        ruled = id == NULL ? 0 : PyDict_Contains(fast, id); /* (unset: checked in Python) */
        if (ruled < 0) {
            Py_DECREF(message);
            goto cleanup;
        }
        ruled = !ruled;
    }
    if (is_signed) {
        Py_SETREF(message, PyObject_CallFunctionObjArgs(sp->parse_verified, message, registry,
                                                        NULL));
        if (message == NULL)
            goto cleanup;
    }
    if (ruled) { /* (its rules: in Python) */
        PyObject *checked = PyObject_CallFunctionObjArgs(sp->parse_constraints, registry,
                                                         message, NULL);
        if (checked == NULL) {
            Py_DECREF(message);
            goto cleanup;
        }
        Py_DECREF(checked);
    }
    result = message;
    goto cleanup;
decline:
    result = Py_NewRef(Py_None);
cleanup:
    body_refusal_free(&why);
    Py_XDECREF(value);
    Py_XDECREF(text);
    Py_DECREF(protocols);
    Py_DECREF(fast);
    return result;
}

/* A call f(data, registry=R) of exact bytes data served by fast(data, R) (a message; None:
 * not served), any other, or one fast does not serve, by the entry's fallback: the shape of
 * parse_call and one_shot_call. */
static PyObject *
data_registry_call(NativeState *st, CEntry *e,
                   PyObject *(*fast)(NativeState *, PyObject *, PyObject *),
                   PyObject *const *args, Py_ssize_t nargs, PyObject *kwnames)
{
    if (nargs == 1 && kwnames != NULL && PyTuple_GET_SIZE(kwnames) == 1 &&
            PyBytes_CheckExact(args[0]) &&
            PyUnicode_Compare(PyTuple_GET_ITEM(kwnames, 0), st->speedups.s_registry) == 0) {
        PyObject *message = fast(st, args[0], args[1]);
        if (message != Py_None)
            return message; /* (or NULL: an exception) */
        Py_DECREF(message);
    }
    PyObject *fallback = entry_fallback(e);
    return fallback == NULL ? NULL :
                              PyObject_Vectorcall(fallback, args, (size_t)nargs, kwnames);
}

static PyObject *
parse_call(PyObject *module, PyObject *const *args, Py_ssize_t nargs, PyObject *kwnames)
{
    NativeState *st = native_state(module);
    if (st == NULL)
        return NULL;
    /* parse(data, registry=R, type=C): parse_fast's message made an instance of C by
     * records.c's cbcl_record_of_decoded; anything it declines, by the fallback */
    if (nargs == 1 && kwnames != NULL && PyTuple_GET_SIZE(kwnames) == 2 &&
            PyBytes_CheckExact(args[0]) && args[2] != Py_None &&
            PyUnicode_Compare(PyTuple_GET_ITEM(kwnames, 0), st->speedups.s_registry) == 0 &&
            PyUnicode_Compare(PyTuple_GET_ITEM(kwnames, 1), st->speedups.s_type) == 0) {
        PyObject *message = parse_fast(st, args[0], args[1]);
        if (message != NULL && message != Py_None)
            Py_SETREF(message, record_of_decoded(st, args[2], message, args[1]));
        if (message != Py_None)
            return message; /* (or NULL: an exception) */
        Py_DECREF(message);
    }
    return data_registry_call(st, &st->speedups.parse_entry, parse_fast, args, nargs,
                              kwnames);
}

/* parse_entry(fallback, doc, verified, only_space_after, tables, cache, make_atom, limits,
 * declined, constraints) -> function | None: cbcl.parse in C (see parse_call); None if
 * cbcl._native is not built. limits: the default limits' max_message_bytes, max_depth,
 * max_list_items, max_nodes, max_string_bytes and max_name_chars. */
static PyObject *
parse_entry(PyObject *module, PyObject *args)
{
    NativeState *st = native_state(module);
    if (st == NULL)
        return NULL;
    SpeedupsState *sp = &st->speedups;
    PyObject *fallback, *doc, *verified, *space_after, *tables, *cache, *atom, *limits;
    PyObject *declined, *constraints;
    if (!PyArg_ParseTuple(args, "OUOOO!O!OO!OO", &fallback, &doc, &verified, &space_after,
                          &PyTuple_Type, &tables, &PyDict_Type, &cache, &atom, &PyTuple_Type,
                          &limits, &declined, &constraints))
        return NULL;
    if (!PyCallable_Check(verified) || !PyCallable_Check(space_after) ||
            !PyCallable_Check(atom) || !PyCallable_Check(declined) ||
            !PyCallable_Check(constraints) || !tables_ok(tables)) {
        if (!PyErr_Occurred())
            PyErr_SetString(PyExc_TypeError, "parse_entry's callables must be callable");
        return NULL;
    }
    if (PyTuple_GET_SIZE(limits) != L_COUNT) {
        PyErr_SetString(PyExc_TypeError, "parse_entry takes six limits");
        return NULL;
    }
    Py_ssize_t values[L_COUNT];
    for (int k = 0; k < L_COUNT; k++) {
        values[k] = PyLong_AsSsize_t(PyTuple_GET_ITEM(limits, k));
        if (values[k] == -1 && PyErr_Occurred())
            return NULL;
    }
    if (entry_set(&sp->parse_entry, fallback, doc) < 0)
        return NULL;
    Py_XSETREF(sp->parse_verified, Py_NewRef(verified));
    Py_XSETREF(sp->parse_space_after, Py_NewRef(space_after));
    Py_XSETREF(sp->parse_tables, Py_NewRef(tables));
    Py_XSETREF(sp->parse_cache, Py_NewRef(cache));
    Py_XSETREF(sp->parse_atom, Py_NewRef(atom));
    Py_XSETREF(sp->parse_declined, Py_NewRef(declined));
    Py_XSETREF(sp->parse_constraints, Py_NewRef(constraints));
    memcpy(sp->parse_limits, values, sizeof values);
    return entry_function(&sp->parse_entry, module);
}

/* decode_entry's bind: the member descriptors of the Decoder's slots _frame_state,
 * require_signatures and registry (its own); where it has none, every call falls back. */
static int
decoder_bind(NativeState *st, PyTypeObject *owner)
{
    PyObject *state = entry_member(owner, "_frame_state");
    PyObject *require = entry_member(owner, "require_signatures");
    PyObject *registry = entry_member(owner, "registry");
    if (state == NULL || require == NULL || registry == NULL) {
        Py_CLEAR(state);
        Py_CLEAR(require);
        Py_CLEAR(registry);
    }
    Py_XSETREF(st->speedups.decoder_frame_state, state);
    Py_XSETREF(st->speedups.decoder_require, require);
    Py_XSETREF(st->speedups.decoder_registry, registry);
    return 0;
}

/* decode_entry(fallback, doc, verified) -> MethodEntry: Decoder.decode in C, the object
 * the class body binds (module.c; decoder_bind finds its slots when the class is made). */
static PyObject *
decode_entry(PyObject *module, PyObject *args)
{
    NativeState *st = native_state(module);
    if (st == NULL)
        return NULL;
    PyObject *fallback, *doc, *verified;
    if (!PyArg_ParseTuple(args, "OUO", &fallback, &doc, &verified))
        return NULL;
    if (!PyCallable_Check(verified)) {
        PyErr_SetString(PyExc_TypeError, "verified must be callable");
        return NULL;
    }
    if (entry_set(&st->speedups.decode_entry, fallback, doc) < 0)
        return NULL;
    Py_XSETREF(st->speedups.decode_verified, Py_NewRef(verified));
    return cbcl_method_entry(st, &st->speedups.decode_entry);
}

/* cbcl.decode as a C function (cbcl/_native_src/entry.h): the ordinary call, decode(data,
 * registry=registry) with data exact bytes and registry an exact cbcl.Registry whose
 * one-shot memos (Registry._one_shot, a cbcl.binary._codec._Memos) hold the default limits'
 * frame state (_Memos.default_state), is decode_frame_of with that state; a signed message
 * goes through one_shot_verified(message, registry) (the trust store's check, as decode has
 * it). Any other call, a registry whose state is not made yet, or a frame decode_frame
 * declines, falls back to the Python function (which makes the state, or decodes the
 * frame carefully). */
static PyObject *one_shot_call(PyObject *module, PyObject *const *args, Py_ssize_t nargs,
                               PyObject *kwnames);
/* (the template of st->speedups.one_shot_entry; its state beside it: one_shot_verified,
 * cbcl.protocol._api._verified(message, registry); one_shot_registry, cbcl.Registry;
 * one_shot_memos, cbcl.binary._codec._Memos; memos_default_state, _Memos.default_state's
 * member descriptor) */
static const CEntry ONE_SHOT_ENTRY = {
    {"decode", (PyCFunction)(void (*)(void))one_shot_call, METH_FASTCALL | METH_KEYWORDS,
     NULL}, NULL, NULL, NULL, NULL};

/* The message of one_shot_call's ordinary case; None: not that case (or declined). */
static PyObject *
one_shot_fast(NativeState *st, PyObject *data, PyObject *registry)
{
    SpeedupsState *sp = &st->speedups;
    if (Py_TYPE(registry) != sp->one_shot_registry)
        Py_RETURN_NONE;
    PyObject *memos = PyObject_GetAttr(registry, sp->s_one_shot);
    if (memos == NULL) {
        if (!PyErr_ExceptionMatches(PyExc_AttributeError))
            return NULL;
        PyErr_Clear();
        Py_RETURN_NONE;
    }
    PyObject *state = Py_TYPE(memos) == sp->one_shot_memos ?
                      entry_get(sp->memos_default_state, memos) : NULL;
    Py_DECREF(memos);
    PyObject *message = state == NULL || state == Py_None ? Py_NewRef(Py_None) :
                        frame_message(st, data, state, 0, sp->one_shot_verified, registry);
    Py_XDECREF(state);
    return message;
}

static PyObject *
one_shot_call(PyObject *module, PyObject *const *args, Py_ssize_t nargs, PyObject *kwnames)
{
    NativeState *st = native_state(module);
    if (st == NULL)
        return NULL;
    return data_registry_call(st, &st->speedups.one_shot_entry, one_shot_fast, args, nargs,
                              kwnames);
}

/* one_shot_entry(fallback, doc, verified, Registry, _Memos) -> function | None: cbcl.decode
 * in C (see one_shot_call); None if _Memos does not keep default_state in a slot. */
static PyObject *
one_shot_entry(PyObject *module, PyObject *args)
{
    NativeState *st = native_state(module);
    if (st == NULL)
        return NULL;
    SpeedupsState *sp = &st->speedups;
    PyObject *fallback, *doc, *verified, *registry, *memos;
    if (!PyArg_ParseTuple(args, "OUOO!O!", &fallback, &doc, &verified, &PyType_Type,
                          &registry, &PyType_Type, &memos))
        return NULL;
    if (!PyCallable_Check(verified)) {
        PyErr_SetString(PyExc_TypeError, "verified must be callable");
        return NULL;
    }
    PyObject *member = entry_member((PyTypeObject *)memos, "default_state");
    if (member == NULL)
        Py_RETURN_NONE;
    if (entry_set(&sp->one_shot_entry, fallback, doc) < 0) {
        Py_DECREF(member);
        return NULL;
    }
    Py_XSETREF(sp->one_shot_verified, Py_NewRef(verified));
    Py_XSETREF(sp->one_shot_registry, (PyTypeObject *)Py_NewRef(registry));
    Py_XSETREF(sp->one_shot_memos, (PyTypeObject *)Py_NewRef(memos));
    Py_XSETREF(sp->memos_default_state, member);
    return entry_function(&sp->one_shot_entry, module);
}

PyMethodDef cbcl_speedups_methods[] = {
    {"parse_entry", parse_entry, METH_VARARGS,
     "parse_entry(fallback, doc, verified, only_space_after, tables, cache, make_atom, "
     "limits, declined, constraints, /) -> function | None: cbcl.parse in C, falling "
     "back to the Python function "
     "(cbcl/_native_src/entry.h); None if cbcl._native is not built."},
    {"decode_entry", decode_entry, METH_VARARGS,
     "decode_entry(fallback, doc, verified, /) -> MethodEntry: Decoder.decode in C, "
     "falling back to the Python method (cbcl/_native_src/entry.h), for Decoder's class "
     "body; where the class does not keep the slots it reads, every call falls back."},
    {"one_shot_entry", one_shot_entry, METH_VARARGS,
     "one_shot_entry(fallback, doc, verified, Registry, _Memos, /) -> function | None: "
     "cbcl.decode in C, falling back to the Python function (cbcl/_native_src/entry.h)."},
    {"refusal_of", refusal_of, METH_VARARGS,
     "refusal_of(body, node, classes, terminals, step, refused, accept) -> tuple | None: "
     "recognise's walk, reporting where the grammar refused the body (kind, path, node, "
     "cls, frames), None if it accepts it."},
    {"text_index", text_index, METH_VARARGS,
     "text_index(text, path, kind) -> int: the character index of the token a refusal "
     "points at in a document read whole (cbcl.protocol._pass2.refusal_index_python's "
     "twin): one lexical pass up to it."},
    {"decode_frame", (PyCFunction)(void (*)(void))decode_frame, METH_FASTCALL,
     "decode_frame(data, state) -> Message | None: a whole frame decoded and recognised "
     "(cbcl.binary._codec._fast_frame)."},
    {"accept_document", (PyCFunction)(void (*)(void))accept_document, METH_FASTCALL,
     "accept_document(value, tables, protocols) -> Message | None: both passes over a "
     "document value (cbcl.protocol._api.accept_document_python)."},
    {"make_object", make_object, METH_VARARGS,
     "make_object(type, attributes, values) -> object: an instance given its attributes "
     "without __init__ (Message._trusted)."},
    {"schema_valid", schema_valid, METH_VARARGS,
     "schema_valid(pairs, body, has_heads) -> bool | None: the schema check's C twin "
     "(of cbcl.protocol._schema._explain)."},
    {"frame_envelope", frame_envelope, METH_VARARGS,
     "frame_envelope(data, start, intents, uris, max_string, entries) -> tuple | None: "
     "a frame's envelope fields and where its body starts."},
    {"envelope", envelope, METH_VARARGS,
     "envelope(value, version, fields, intents, signature, message, attributes, uri, "
     "symbol) -> Message | None: the message of a document value (cbcl.protocol._envelope._walk)."},
    {"recognise", recognise, METH_VARARGS,
     "recognise(body, node, classes, terminals, step, refused, accept) -> bool: whether "
     "the automaton accepts the body from node (cbcl.protocol._pass2.recognise_body's loop)."},
    {"unpack", unpack, METH_VARARGS,
     "unpack(data, start) -> list | None: the ints and strs of a frame's tokens."},
    {"check_atom", check_atom, METH_VARARGS,
     "check_atom(code, text) -> bool: the lexical rule of an atom kind, as build_body "
     "applies it."},
    {"build_body", build_body, METH_VARARGS,
     "build_body(data, offset, entries, codes, caches, make_atom, start, step, "
     "max_depth, max_items, max_string, max_name, budget, refused, accept, memo_entries) "
     "-> value | None."},
    {NULL, NULL, 0, NULL},
};

/* The interned strings, FrameState and the entries of speedups.c, in st->speedups
 * (module.c's exec; the value types are the scanner's set-up's): 0, or -1 with an
 * exception. */
int
cbcl_speedups_exec(PyObject *module, NativeState *st)
{
    SpeedupsState *sp = &st->speedups;
    PyObject *type = PyType_FromModuleAndSpec(module, &frame_state_spec, NULL);
    if (type == NULL)
        return -1;
    sp->frame_state_type = (PyTypeObject *)type; /* (strong: the state's) */
    if (PyModule_AddObjectRef(module, "FrameState", type) < 0)
        return -1;
    if ((sp->s_lpar = PyUnicode_InternFromString("LPAR")) == NULL ||
        (sp->s_rpar = PyUnicode_InternFromString("RPAR")) == NULL ||
        (sp->s_end = PyUnicode_InternFromString("$END")) == NULL ||
        (sp->s_string = PyUnicode_InternFromString("STRING")) == NULL ||
        (sp->s_integer = PyUnicode_InternFromString("INTEGER")) == NULL ||
        (sp->s_kinds[DECIMAL] = PyUnicode_InternFromString("DECIMAL")) == NULL ||
        (sp->s_kinds[SYMBOL] = PyUnicode_InternFromString("SYMBOL")) == NULL ||
        (sp->s_kinds[KEYWORD] = PyUnicode_InternFromString("KEYWORD")) == NULL ||
        (sp->s_kinds[URI] = PyUnicode_InternFromString("URI")) == NULL ||
        (sp->s_packed = PyUnicode_InternFromString("packed")) == NULL ||
        (sp->s_min_length = PyUnicode_InternFromString("min_length")) == NULL ||
        (sp->s_max_length = PyUnicode_InternFromString("max_length")) == NULL ||
        (sp->s_item = PyUnicode_InternFromString("_item")) == NULL ||
        (sp->s_start = PyUnicode_InternFromString("start")) == NULL ||
        (sp->s_acceptance = PyUnicode_InternFromString("acceptance")) == NULL ||
        (sp->s_registry = PyUnicode_InternFromString("registry")) == NULL ||
        (sp->s_protocols_by_id = PyUnicode_InternFromString("_protocols_by_id")) == NULL ||
        (sp->s_cbcl_converter = PyUnicode_InternFromString("__cbcl_converter__")) == NULL ||
        (sp->s_type = PyUnicode_InternFromString("type")) == NULL ||
        (sp->s_one_shot = PyUnicode_InternFromString("_one_shot")) == NULL)
        return -1;
    sp->decode_entry = DECODE_ENTRY;
    sp->parse_entry = PARSE_ENTRY;
    sp->one_shot_entry = ONE_SHOT_ENTRY;
    return 0;
}

int
cbcl_speedups_traverse(NativeState *st, visitproc visit, void *arg)
{
    SpeedupsState *sp = &st->speedups;
    Py_VISIT(sp->s_lpar);
    Py_VISIT(sp->s_rpar);
    Py_VISIT(sp->s_end);
    Py_VISIT(sp->s_string);
    Py_VISIT(sp->s_integer);
    for (int k = 0; k < FIRST_ENTRY; k++)
        Py_VISIT(sp->s_kinds[k]);
    Py_VISIT(sp->s_packed);
    Py_VISIT(sp->s_min_length);
    Py_VISIT(sp->s_max_length);
    Py_VISIT(sp->s_item);
    Py_VISIT(sp->s_start);
    Py_VISIT(sp->s_acceptance);
    Py_VISIT(sp->s_registry);
    Py_VISIT(sp->s_protocols_by_id);
    Py_VISIT(sp->s_cbcl_converter);
    Py_VISIT(sp->s_type);
    Py_VISIT(sp->s_one_shot);
    Py_VISIT(sp->frame_state_type);
    for (int k = 0; k < ATOM_SLOTS; k++) {
        Py_VISIT(sp->atom_memo[k].key);
        Py_VISIT(sp->atom_memo[k].value);
    }
    Py_VISIT(sp->grammar_names);
    Py_VISIT(sp->grammar_names_also);
    Py_VISIT(sp->pairs_type);
    Py_VISIT(sp->pairs_packed);
    CBCL_VISIT_ENTRY(sp->decode_entry);
    Py_VISIT(sp->decode_verified);
    Py_VISIT(sp->decoder_frame_state);
    Py_VISIT(sp->decoder_require);
    Py_VISIT(sp->decoder_registry);
    CBCL_VISIT_ENTRY(sp->parse_entry);
    Py_VISIT(sp->parse_verified);
    Py_VISIT(sp->parse_space_after);
    Py_VISIT(sp->parse_tables);
    Py_VISIT(sp->parse_cache);
    Py_VISIT(sp->parse_atom);
    Py_VISIT(sp->parse_last_registry);
    Py_VISIT(sp->parse_last_protocols);
    Py_VISIT(sp->parse_last_fast);
    Py_VISIT(sp->parse_declined);
    Py_VISIT(sp->parse_constraints);
    CBCL_VISIT_ENTRY(sp->one_shot_entry);
    Py_VISIT(sp->one_shot_verified);
    Py_VISIT(sp->one_shot_registry);
    Py_VISIT(sp->one_shot_memos);
    Py_VISIT(sp->memos_default_state);
    return 0;
}

void
cbcl_speedups_clear(NativeState *st)
{
    SpeedupsState *sp = &st->speedups;
    Py_CLEAR(sp->s_lpar);
    Py_CLEAR(sp->s_rpar);
    Py_CLEAR(sp->s_end);
    Py_CLEAR(sp->s_string);
    Py_CLEAR(sp->s_integer);
    for (int k = 0; k < FIRST_ENTRY; k++)
        Py_CLEAR(sp->s_kinds[k]);
    Py_CLEAR(sp->s_packed);
    Py_CLEAR(sp->s_min_length);
    Py_CLEAR(sp->s_max_length);
    Py_CLEAR(sp->s_item);
    Py_CLEAR(sp->s_start);
    Py_CLEAR(sp->s_acceptance);
    Py_CLEAR(sp->s_registry);
    Py_CLEAR(sp->s_protocols_by_id);
    Py_CLEAR(sp->s_cbcl_converter);
    sp->record_type = sp->record_converter = NULL;
    Py_CLEAR(sp->s_type);
    Py_CLEAR(sp->s_one_shot);
    Py_CLEAR(sp->frame_state_type);
    for (int k = 0; k < ATOM_SLOTS; k++) {
        Py_CLEAR(sp->atom_memo[k].key);
        Py_CLEAR(sp->atom_memo[k].value);
    }
    Py_CLEAR(sp->grammar_names);
    Py_CLEAR(sp->grammar_names_also);
    Py_CLEAR(sp->pairs_type);
    Py_CLEAR(sp->pairs_packed);
    PyMem_Free(sp->passages);
    sp->passages = NULL;
    CBCL_CLEAR_ENTRY(sp->decode_entry);
    Py_CLEAR(sp->decode_verified);
    Py_CLEAR(sp->decoder_frame_state);
    Py_CLEAR(sp->decoder_require);
    Py_CLEAR(sp->decoder_registry);
    CBCL_CLEAR_ENTRY(sp->parse_entry);
    Py_CLEAR(sp->parse_verified);
    Py_CLEAR(sp->parse_space_after);
    Py_CLEAR(sp->parse_tables);
    Py_CLEAR(sp->parse_cache);
    Py_CLEAR(sp->parse_atom);
    Py_CLEAR(sp->parse_last_registry);
    Py_CLEAR(sp->parse_last_protocols);
    Py_CLEAR(sp->parse_last_fast);
    Py_CLEAR(sp->parse_declined);
    Py_CLEAR(sp->parse_constraints);
    CBCL_CLEAR_ENTRY(sp->one_shot_entry);
    Py_CLEAR(sp->one_shot_verified);
    Py_CLEAR(sp->one_shot_registry);
    Py_CLEAR(sp->one_shot_memos);
    Py_CLEAR(sp->memos_default_state);
}
