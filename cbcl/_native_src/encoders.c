/* Optional accelerator of the encoders: canonical text (cbcl/core/_canonical.py) and the binary
 * frame writer (cbcl/binary/_codec.py).
 *
 * Theory of operation
 * -------------------
 * Functions, each the C twin of Python code that stays the reference and the fallback
 * when this module is not built (or when they decline):
 *
 *   canonical(value)                        -> str | None
 *       twin of cbcl.core._canonical._canonical_value_python
 *   canonical_message(message)              -> str | None
 *       twin of cbcl.protocol._message.Message.canonical: canonical(message.to_value())'s text,
 *       written from the message's slots (no envelope list is built)
 *   pack_frame(header, tokens, body, table) -> bytes | None
 *       twin of the tail of cbcl.binary._codec.Encoder.encode: header + msgpack of the envelope
 *       tokens + the body's tokens (cbcl.binary._codec._body_tokens), as msgpack.packb writes them;
 *       table is prepare(codes), a symbol table's codes held as a C hash table
 *   pack_message(header, message, table)    -> bytes | None
 *       the whole of Encoder.encode after validation: the envelope tokens too, from the
 *       message's slots
 *   encode_message(message, registry, tables) -> bytes | None
 *       pack_message with the header and table the Encoder cached (Encoder._tables) for the
 *       protocol registry.get finds: Encoder(validate=False).encode in one call
 *
 * The symbol table and the atoms a frame writes in full are looked up in C hash tables
 * keyed by exact Symbol, Keyword and URI objects, equal when of one type and one text, as
 * cbcl.core._values._Atom.__eq__ has them: no Python code runs during a walk.
 *
 * All serve only the ordinary case and raise nothing for anything in their input: on any
 * doubt (a type that is not exactly a CBCL type - bool, a subclass, a float -, an integer
 * outside int64, a lone surrogate, a non-finite or over-long decimal, nesting deeper than
 * MAX_DEPTH, a string over 4 GiB ...) they return None and the Python twin writes the same
 * value again, or raises exactly the error it always raised. Exceptions come only from the
 * interpreter (MemoryError).
 *
 * The walks are iterative: an explicit stack of (container, next index) frames, each
 * holding a strong reference to its container (a list stays alive, and is indexed within
 * its current size, even if Python code run by a lookup let another thread change it).
 * MAX_DEPTH bounds the stack; deeper values go to the Python twins, which have no limit of
 * their own (the decoders' max_depth is a Limits setting, checked elsewhere).
 *
 * The text writer builds a str of the narrowest kind that holds what it writes (1, 2 or
 * 4 bytes per character), widening its buffer when a wider character comes, as CPython's
 * own writers do, so the result is a canonical str (its kind is its widest character's).
 * Strings are copied whole unless they need an escape; a string that does is written
 * character by character, and escaped characters count as the ASCII they become.
 *
 * Decimals are read into sign, coefficient digits and exponent (Decimal.as_tuple()'s
 * parts): from _decimal's own mpd_t when setup() has found the type laid out as libmpdec's
 * public struct says (and the parts of sample decimals agree with their text), else from
 * their scientific text (str(d), which _decimal computes in C and keeps short: "1E+999999"
 * is 9 characters). They are sized before anything is written (the Python twin's rule),
 * then written in positional notation with at least one fractional digit.
 *
 * canonical_message(message) and pack_message / encode_message(message ...) write a whole
 * message: Message.canonical()'s text and Encoder.encode()'s frame, from the fields of an
 * exact Message (read from its MessageFields struct, native.h: setup_message() checks the
 * class adds nothing to it), the envelope written as Message.to_value() and the Python
 * encoder list it, each field's value
 * by the same writers as the body's; anything else (a subclass, an intent that is not an
 * Intent member, a signature that is not an exact Signature, an unset slot) declines.
 *
 * setup() gives the module the types and constants it needs (cbcl/core/_canonical.py calls it
 * when it imports this module), so nothing here can drift from cbcl.core._values and
 * cbcl.core._vocabulary.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stdint.h>
#include <string.h>
#include "entry.h"
#include "native.h"

#define MAX_DEPTH 10000

/* memcpy of n bytes, the short copies of atoms inline (fixed-size moves, no call). */
static inline void
copy_bytes(char *dst, const char *src, size_t n)
{
    if (n >= 8 && n <= 16) { /* two overlapping words */
        uint64_t a, b;
        memcpy(&a, src, 8);
        memcpy(&b, src + n - 8, 8);
        memcpy(dst, &a, 8);
        memcpy(dst + n - 8, &b, 8);
    } else if (n >= 4 && n < 8) {
        uint32_t a, b;
        memcpy(&a, src, 4);
        memcpy(&b, src + n - 4, 4);
        memcpy(dst, &a, 4);
        memcpy(dst + n - 4, &b, 4);
    } else if (n > 0 && n < 4) {
        dst[0] = src[0];
        dst[n / 2] = src[n / 2];
        dst[n - 1] = src[n - 1];
    } else if (n > 16) {
        memcpy(dst, src, n);
    }
}

#if defined(__GNUC__) || defined(__clang__)
#define PREFETCH(p) __builtin_prefetch((const void *)(p))
#else
#define PREFETCH(p) ((void)(p))
#endif
/* How far ahead the binary walk asks for a list's items: 8 served a 64 KB mixed encode in
 * ~82 us where 4 took ~96 and none ~118 (msgspec's ~95, same runs). */
#define PREFETCH_AHEAD 8

/* What setup(), setup_message() and setup_frame() give the section is kept in the module's
 * state (native.h's EncodersState, st->encoders): the value types, the token codes, the
 * longest decimal text (max_decimal_chars, -1 until setup() has run: every twin then
 * declines), the message types, the envelope's names. The
 * walks are handed it (`enc`, a const pointer) by the function the module's state is
 * found in. */

/* Outcomes of the helpers: OK, DECLINE (the Python twin takes over), FAIL (an exception
 * is set). */
enum { OK = 0, DECLINE = 1, FAIL = -1 };

/* ------------------------------------------------------------------------- the stack */

typedef struct {
    PyObject *seq; /* a strong reference: an exact tuple or list */
    Py_ssize_t index;
} Frame;

#define INLINE_FRAMES 32

typedef struct {
    Frame *frames; /* inline, or on the heap once deeper than INLINE_FRAMES */
    Py_ssize_t depth, cap;
    Frame inline_frames[INLINE_FRAMES];
} Stack;

#define STACK_INIT(s) ((s).frames = (s).inline_frames, (s).depth = 0, (s).cap = INLINE_FRAMES)

static int
stack_push(Stack *s, PyObject *seq)
{
    if (s->depth >= MAX_DEPTH)
        return DECLINE;
    if (s->depth == s->cap) {
        Py_ssize_t cap = s->cap * 2;
        Frame *frames;
        if (s->frames == s->inline_frames) {
            frames = PyMem_Malloc((size_t)cap * sizeof(Frame));
            if (frames != NULL)
                memcpy(frames, s->frames, (size_t)s->depth * sizeof(Frame));
        } else {
            frames = PyMem_Realloc(s->frames, (size_t)cap * sizeof(Frame));
        }
        if (frames == NULL) {
            PyErr_NoMemory();
            return FAIL;
        }
        s->frames = frames;
        s->cap = cap;
    }
    Py_INCREF(seq);
    s->frames[s->depth].seq = seq;
    s->frames[s->depth].index = 0;
    s->depth++;
    return OK;
}

static void
stack_free(Stack *s)
{
    for (Py_ssize_t i = 0; i < s->depth; i++)
        Py_DECREF(s->frames[i].seq);
    if (s->frames != s->inline_frames)
        PyMem_Free(s->frames);
    STACK_INIT(*s);
}

/* The next item of the innermost container (borrowed: no Python code runs while it is
 * used, but for a Decimal's str(), around which it is held), or NULL at its end. */
static PyObject *
stack_next(Stack *s)
{
    Frame *f = &s->frames[s->depth - 1];
    PyObject *seq = f->seq, *item;
    if (PyTuple_CheckExact(seq)) {
        Py_ssize_t size = PyTuple_GET_SIZE(seq);
        if (f->index >= size)
            return NULL;
        item = PyTuple_GET_ITEM(seq, f->index);
        /* The walk is bound by the first touch of each item (its type): ask for the one
         * after next while this one is written. (The binary walk's further prefetch,
         * PREFETCH_AHEAD, made no difference here in interleaved runs.) */
        if (f->index + 4 < size)
            PREFETCH(PyTuple_GET_ITEM(seq, f->index + 4));
    } else {
        if (f->index >= PyList_GET_SIZE(seq))
            return NULL;
        item = PyList_GET_ITEM(seq, f->index);
    }
    f->index++;
    return item;
}

static void
stack_pop(Stack *s)
{
    s->depth--;
    Py_DECREF(s->frames[s->depth].seq);
}

#define IS_LIST(o) (PyTuple_CheckExact(o) || PyList_CheckExact(o))


/* A str's kind and data are valid once it is "ready" (always, from Python 3.12 on). */
#if PY_VERSION_HEX < 0x030C0000
#define READY(s) (PyUnicode_READY(s) < 0 ? FAIL : OK)
#else
#define READY(s) OK
#endif

/* ------------------------------------------------------------------------- decimals */

/* A finite decimal's parts: sign, coefficient digits (ASCII, no leading zero; none for
 * zero) and exponent, as Decimal.as_tuple() has them. */
#define MAX_DIGITS 64 /* more than any decimal within max_decimal_chars (<= 100) has */

typedef struct {
    int sign;
    char digits[MAX_DIGITS];
    Py_ssize_t ndigits;
    long long exponent;
} DecimalParts;

/* The parts read back from str(value), which _decimal computes in C: DECLINE for
 * "Infinity", "NaN", "sNaN" or more than MAX_DIGITS digits. */
static int
decimal_parts_of_text(PyObject *value, DecimalParts *d)
{
    Py_INCREF(value); /* (borrowed from a list another thread might change meanwhile) */
    PyObject *str = PyObject_Str(value);
    Py_DECREF(value);
    if (str == NULL)
        return FAIL;
    int result = DECLINE;
    Py_ssize_t n;
    const char *s = PyUnicode_AsUTF8AndSize(str, &n);
    if (s == NULL) {
        Py_DECREF(str);
        return FAIL;
    }
    Py_ssize_t i = 0;
    d->sign = 0;
    d->ndigits = 0;
    if (i < n && s[i] == '-') {
        d->sign = 1;
        i++;
    }
    /* the coefficient: digits with at most one point */
    Py_ssize_t fraction = 0;
    int point = 0, any = 0;
    for (; i < n && s[i] != 'E' && s[i] != 'e'; i++) {
        char c = s[i];
        if (c == '.' && !point) {
            point = 1;
            continue;
        }
        if (c < '0' || c > '9')
            goto done;
        any = 1;
        if (point)
            fraction++;
        if (d->ndigits == 0 && c == '0')
            continue; /* leading zeros are not coefficient digits */
        if (d->ndigits >= MAX_DIGITS)
            goto done;
        d->digits[d->ndigits++] = c;
    }
    if (!any)
        goto done;
    long long exponent = 0;
    if (i < n) { /* E[+-]digits */
        i++;
        int negative = 0;
        if (i < n && (s[i] == '+' || s[i] == '-')) {
            negative = s[i] == '-';
            i++;
        }
        if (i >= n || n - i > 18)
            goto done;
        for (; i < n; i++) {
            if (s[i] < '0' || s[i] > '9')
                goto done;
            exponent = exponent * 10 + (s[i] - '0');
        }
        if (negative)
            exponent = -exponent;
    }
    d->exponent = exponent - fraction;
    result = OK;
done:
    Py_DECREF(str);
    return result;
}

/* The layout of an exact _decimal.Decimal: PyDecObject around libmpdec's mpd_t (public in
 * mpdecimal.h), limbs of LIMB_DIGITS decimal digits. Read only when setup() has checked
 * it (enc->decimal_layout: the type's size is this struct's, and the parts it gives of sample
 * decimals are those their text gives); decimal_parts_of_text otherwise. */
typedef struct {
    uint8_t flags; /* MPD_NEG 1, MPD_INF 2, MPD_NAN 4, MPD_SNAN 8 */
    Py_ssize_t exp, digits, len, alloc;
    void *data;
} Mpd;

typedef struct {
    PyObject_HEAD
    Py_hash_t hash;
    Mpd dec;
    size_t data[4];
} DecObject;

/* "00" to "99", for writing numbers two digits at a time */
static const char DIGIT_PAIRS[] =
    "00010203040506070809101112131415161718192021222324252627282930313233343536373839"
    "40414243444546474849505152535455565758596061626364656667686970717273747576777879"
    "8081828384858687888990919293949596979899";
#define LIMB_DIGITS (sizeof(size_t) == 8 ? 19 : 9)

static int
decimal_parts_of_layout(PyObject *value, DecimalParts *d)
{
    const Mpd *m = &((DecObject *)value)->dec;
    if ((m->flags & 14) || m->data == NULL || m->len < 1 || m->len > m->alloc ||
        m->digits < 1 || m->digits > MAX_DIGITS || m->len > MAX_DIGITS / 9 + 1)
        return DECLINE;
    const size_t *limbs = m->data;
    /* The digits written backwards straight into place, least significant limb first:
     * a lower limb has exactly LIMB_DIGITS (zero-padded), the top one no leading zero. */
    char *const start = d->digits;
    char *p = start + m->digits;
    Py_ssize_t top = m->len - 1;
    for (Py_ssize_t i = 0; i < top; i++) {
        size_t v = limbs[i];
        if (p - start < (Py_ssize_t)LIMB_DIGITS)
            return DECLINE;
        char *const stop = p - LIMB_DIGITS;
        while (p - stop >= 2) {
            unsigned pair = (unsigned)(v % 100) * 2;
            v /= 100;
            *--p = DIGIT_PAIRS[pair + 1];
            *--p = DIGIT_PAIRS[pair];
        }
        if (p > stop) {
            *--p = (char)('0' + v % 10);
            v /= 10;
        }
        if (v)
            return DECLINE; /* more than LIMB_DIGITS digits: not the layout it seemed */
    }
    size_t v = limbs[top];
    while (v >= 100) {
        if (p - start < 2)
            return DECLINE;
        unsigned pair = (unsigned)(v % 100) * 2;
        v /= 100;
        *--p = DIGIT_PAIRS[pair + 1];
        *--p = DIGIT_PAIRS[pair];
    }
    if (v >= 10) {
        if (p - start < 2)
            return DECLINE;
        *--p = DIGIT_PAIRS[v * 2 + 1];
        *--p = DIGIT_PAIRS[v * 2];
    } else {
        if (p - start < 1)
            return DECLINE;
        *--p = (char)('0' + v);
    }
    if (p != start)
        return DECLINE; /* fewer digits than m->digits: not the layout it seemed to be */
    d->sign = m->flags & 1;
    d->exponent = m->exp;
    if (m->digits == 1 && start[0] == '0') {
        d->ndigits = 0;
    } else {
        if (start[0] == '0')
            return DECLINE;
        d->ndigits = m->digits;
    }
    return OK;
}

/* A decimal's text as canonical writes it: its parts and its length, found before
 * anything is written (the Python twin's rule), then written by decimal_write. */
typedef struct {
    DecimalParts parts; /* a zero's coefficient is one digit "0" */
    Py_ssize_t length;
} DecimalText;

/* The text of an exact Decimal (twin of cbcl.core._canonical._decimal) sized: DECLINE for
 * a non-finite or over-long one (longer than enc->max_decimal_chars). */
static int
decimal_size(const EncodersState *enc, PyObject *value, DecimalText *t)
{
    DecimalParts *parts = &t->parts;
    int r = enc->decimal_layout ? decimal_parts_of_layout(value, parts) : DECLINE;
    if (r == DECLINE)
        r = decimal_parts_of_text(value, parts);
    if (r != OK)
        return r;
    int zero = parts->ndigits == 0;
    if (zero)
        parts->digits[parts->ndigits++] = '0';
    Py_ssize_t ndigits = parts->ndigits;
    long long exponent = parts->exponent, length;
    if (exponent >= 0) {
        length = parts->sign + (zero ? 1 : ndigits + exponent) + 2;
    } else {
        long long whole = ndigits + exponent;
        length = parts->sign + (whole > 1 ? whole : 1) + 1 - exponent;
    }
    if (length > enc->max_decimal_chars)
        return DECLINE;
    if (zero && exponent > 0)
        parts->exponent = 0; /* (no zeros after a zero: "0.0") */
    t->length = (Py_ssize_t)length;
    return OK;
}

/* n copies of '0' (n small: at most max_decimal_chars) */
static inline char *
put_zeros(char *p, long long n)
{
    for (; n >= 8; n -= 8, p += 8)
        memcpy(p, "00000000", 8);
    for (; n > 0; n--)
        *p++ = '0';
    return p;
}

/* The text decimal_size sized, written to out (t->length bytes): positional notation,
 * at least one fractional digit. */
static void
decimal_write(const DecimalText *t, char *out)
{
    const DecimalParts *d = &t->parts;
    const char *digits = d->digits;
    Py_ssize_t ndigits = d->ndigits;
    long long exponent = d->exponent;
    char *p = out;
    if (d->sign)
        *p++ = '-';
    if (exponent >= 0) {
        copy_bytes(p, digits, (size_t)ndigits);
        p = put_zeros(p + ndigits, exponent);
        p[0] = '.';
        p[1] = '0';
        return;
    }
    long long whole = ndigits + exponent;
    if (whole > 0) {
        copy_bytes(p, digits, (size_t)whole);
        p += whole;
        *p++ = '.';
        copy_bytes(p, digits + whole, (size_t)(ndigits - whole));
    } else {
        *p++ = '0';
        *p++ = '.';
        p = put_zeros(p, -whole);
        copy_bytes(p, digits, (size_t)ndigits);
    }
}

/* The canonical text of an exact Decimal written to out (at least enc->max_decimal_chars
 * bytes), its length in *size; DECLINE for a non-finite or over-long one. */
static int
decimal_text(const EncodersState *enc, PyObject *value, char *out, Py_ssize_t *size)
{
    DecimalText t;
    int r = decimal_size(enc, value, &t);
    if (r != OK)
        return r;
    decimal_write(&t, out);
    *size = t.length;
    return OK;
}

/* Whether an exact Decimal is laid out as DecObject: the type's size, then the parts of
 * samples (their text's, every digit count to 3 limbs, signs, zeros, exponents). */
static int
decimal_layout_holds(PyTypeObject *type)
{
    if (type->tp_basicsize != (Py_ssize_t)sizeof(DecObject) ||
        strcmp(type->tp_name, "decimal.Decimal") != 0)
        return 0;
    static const char *const samples[] = {
        "0", "-0", "0E-7", "0E+3", "-0.00", "1", "-1", "9", "10", "1.5", "-934.32", "1E+3",
        "1.00E+3", "1.23E-7", "9999999999999999999", "10000000000000000000",
        "1000000000000000000000000000000000000001", "12345678901234567890123456789012345678",
        "-123456789012345678901234567890123456789012345678901234567", "5E-40", "NaN", "sNaN",
        "-Infinity"};
    int holds = 1;
    for (size_t i = 0; holds && i < sizeof(samples) / sizeof(samples[0]); i++) {
        PyObject *d = PyObject_CallFunction((PyObject *)type, "s", samples[i]);
        if (d == NULL) {
            PyErr_Clear();
            return 0;
        }
        if (Py_TYPE(d) != type) {
            Py_DECREF(d);
            return 0;
        }
        DecimalParts a, b;
        int ra = decimal_parts_of_layout(d, &a), rb = decimal_parts_of_text(d, &b);
        if (rb == FAIL)
            PyErr_Clear();
        holds = ra == rb && rb != FAIL &&
                (ra != OK || (a.sign == b.sign && a.exponent == b.exponent &&
                              a.ndigits == b.ndigits &&
                              memcmp(a.digits, b.digits, (size_t)a.ndigits) == 0));
        Py_DECREF(d);
    }
    return holds;
}

/* ------------------------------------------------------------------------- text writer */

#define INLINE_TEXT 2048

typedef struct {
    void *buf; /* inline, or on the heap once longer (or wider) */
    int kind; /* 1, 2 or 4 bytes per character */
    Py_UCS4 maxchar; /* 127, 255, 65535 or 1114111: the kind (and ASCII-ness) of the result */
    Py_ssize_t len, cap; /* in characters */
    char inline_buf[INLINE_TEXT];
} Writer;

#define WRITER_INIT(w) \
    ((w).buf = (w).inline_buf, (w).kind = 1, (w).maxchar = 127, (w).len = 0, \
     (w).cap = INLINE_TEXT)

static void
w_free(Writer *w)
{
    if (w->buf != w->inline_buf)
        PyMem_Free(w->buf);
    w->buf = NULL;
}

static Py_UCS4
level_of(Py_UCS4 c)
{
    return c < 128 ? 127 : c < 256 ? 255 : c < 65536 ? 65535 : 1114111;
}

static int
kind_of_level(Py_UCS4 level)
{
    return level <= 255 ? 1 : level <= 65535 ? 2 : 4;
}

/* Make room for extra more characters of up to level maxchar. */
static int
w_prepare(Writer *w, Py_ssize_t extra, Py_UCS4 maxchar)
{
    int kind = w->kind;
    if (maxchar > w->maxchar) {
        w->maxchar = maxchar;
        kind = kind_of_level(maxchar);
    }
    if (extra > PY_SSIZE_T_MAX / 8 - w->len) {
        PyErr_NoMemory();
        return FAIL;
    }
    Py_ssize_t need = w->len + extra, cap = w->cap;
    if (need > cap)
        cap = need > 2 * cap ? need : 2 * cap;
    if (kind == w->kind) {
        if (cap != w->cap) {
            void *buf;
            if (w->buf == w->inline_buf) {
                buf = PyMem_Malloc((size_t)cap * (size_t)kind);
                if (buf != NULL)
                    memcpy(buf, w->buf, (size_t)w->len * (size_t)kind);
            } else {
                buf = PyMem_Realloc(w->buf, (size_t)cap * (size_t)kind);
            }
            if (buf == NULL) {
                PyErr_NoMemory();
                return FAIL;
            }
            w->buf = buf;
            w->cap = cap;
        }
        return OK;
    }
    /* widen what is written so far */
    void *buf = PyMem_Malloc((size_t)cap * (size_t)kind);
    if (buf == NULL) {
        PyErr_NoMemory();
        return FAIL;
    }
    for (Py_ssize_t i = 0; i < w->len; i++) {
        Py_UCS4 c = PyUnicode_READ(w->kind, w->buf, i);
        PyUnicode_WRITE(kind, buf, i, c);
    }
    w_free(w);
    w->buf = buf;
    w->kind = kind;
    w->cap = cap;
    return OK;
}

/* Write ASCII text; room must have been made. */
static void
w_ascii_unchecked(Writer *w, const char *s, Py_ssize_t n)
{
    if (w->kind == 1) {
        copy_bytes((char *)w->buf + w->len, s, (size_t)n);
    } else {
        for (Py_ssize_t i = 0; i < n; i++)
            PyUnicode_WRITE(w->kind, w->buf, w->len + i, (Py_UCS4)(unsigned char)s[i]);
    }
    w->len += n;
}

/* Room for extra more characters of up to level maxchar (the common case inline). */
static inline int
w_room(Writer *w, Py_ssize_t extra, Py_UCS4 maxchar)
{
    if (maxchar <= w->maxchar && extra <= w->cap - w->len)
        return OK;
    return w_prepare(w, extra, maxchar);
}

/* One ASCII character; room must have been made. */
static inline void
w_put(Writer *w, char c)
{
    if (w->kind == 1)
        ((char *)w->buf)[w->len] = c;
    else
        PyUnicode_WRITE(w->kind, w->buf, w->len, (Py_UCS4)(unsigned char)c);
    w->len++;
}

static inline int
w_char(Writer *w, char c)
{
    if (w_room(w, 1, 127) < 0)
        return FAIL;
    w_put(w, c);
    return OK;
}

static int
w_ascii(Writer *w, const char *s, Py_ssize_t n)
{
    if (w_room(w, n, 127) < 0)
        return FAIL;
    w_ascii_unchecked(w, s, n);
    return OK;
}

/* The whole text of str s (its kind is its widest character's: a canonical str). */
static inline int
w_str(Writer *w, PyObject *s, Py_ssize_t extra_room)
{
    if (READY(s) < 0)
        return FAIL;
    Py_ssize_t n = PyUnicode_GET_LENGTH(s);
    int kind = PyUnicode_KIND(s);
    if (w_room(w, n + extra_room, PyUnicode_MAX_CHAR_VALUE(s)) < 0)
        return FAIL;
    const void *data = PyUnicode_DATA(s);
    if (kind == w->kind) {
        copy_bytes((char *)w->buf + w->len * kind, data, (size_t)n * (size_t)kind);
    } else {
        for (Py_ssize_t i = 0; i < n; i++)
            PyUnicode_WRITE(w->kind, w->buf, w->len + i, PyUnicode_READ(kind, data, i));
    }
    w->len += n;
    return OK;
}

static PyObject *
w_finish(Writer *w)
{
    PyObject *result = PyUnicode_New(w->len, w->maxchar);
    if (result == NULL)
        return NULL;
    /* PyUnicode_New gives the kind of maxchar, which is w->kind */
    memcpy(PyUnicode_DATA(result), w->buf, (size_t)w->len * (size_t)w->kind);
    return result;
}

/* Characters a canonical string escapes (cbcl.core._canonical._NEEDS_ESCAPE): 0 none, 1 the
 * \uXXXX escape, 2 a short escape (\t \n \r \" \\), 3 a lone surrogate (declined). Below
 * 256: the C0 controls, DEL and the C1 controls take \uXXXX. */
static const unsigned char ESCAPE1[256] = {
    1, 1, 1, 1, 1, 1, 1, 1, 1, 2, 2, 1, 1, 2, 1, 1, /* 0x00 */
    1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, /* 0x10 */
    0, 0, 2, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, /* 0x20 */
    0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, /* 0x30 */
    0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, /* 0x40 */
    0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 2, 0, 0, 0, /* 0x50 */
    0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, /* 0x60 */
    0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 1, /* 0x70 */
    1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, /* 0x80 */
    1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, /* 0x90 */
    0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, /* 0xa0 */
    0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, /* 0xb0 */
    0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, /* 0xc0 */
    0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, /* 0xd0 */
    0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, /* 0xe0 */
    0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, /* 0xf0 */
};

static inline int
escape_of(Py_UCS4 c)
{
    if (c < 256)
        return ESCAPE1[c];
    if ((c >= 0x202a && c <= 0x202e) || (c >= 0x2066 && c <= 0x2069))
        return 1;
    if (c >= 0xd800 && c <= 0xdfff)
        return 3;
    return 0;
}

#define ONES 0x0101010101010101ULL
#define HIGHS 0x8080808080808080ULL

/* Whether eight ASCII bytes hold one a canonical string escapes: a control (< 0x20), '"',
 * '\\' or DEL. No false negative (the lowest such byte is found exactly); a false
 * positive (a borrow from a lower byte) only ends the fast scan early. */
static inline int
swar_needs_escape(unsigned long long x)
{
    unsigned long long lt = x - ONES * 0x20;             /* high bit: byte < 0x20 */
    unsigned long long q = x ^ (ONES * '"'), b = x ^ (ONES * '\\'), d = x ^ (ONES * 0x7f);
    unsigned long long zero = (q - ONES) | (b - ONES) | (d - ONES); /* high bit: byte == */
    return ((lt | zero) & HIGHS) != 0;
}

static int
w_quoted(Writer *w, PyObject *s)
{
    if (READY(s) < 0)
        return FAIL;
    Py_ssize_t n = PyUnicode_GET_LENGTH(s);
    int kind = PyUnicode_KIND(s);
    const void *data = PyUnicode_DATA(s);
    Py_ssize_t first = n;
    if (kind == PyUnicode_1BYTE_KIND) {
        const unsigned char *p = data;
        Py_ssize_t i = 0;
        if (PyUnicode_IS_ASCII(s)) { /* eight at a time: none < 0x20, '"', '\\' or 0x7f */
            for (; i + 8 <= n; i += 8) {
                unsigned long long x;
                memcpy(&x, p + i, 8);
                if (swar_needs_escape(x))
                    break;
            }
        }
        for (; i < n; i++) {
            if (ESCAPE1[p[i]]) {
                first = i;
                break;
            }
        }
    } else {
        for (Py_ssize_t i = 0; i < n; i++) {
            if (escape_of(PyUnicode_READ(kind, data, i))) {
                first = i;
                break;
            }
        }
    }
    if (first == n) { /* nothing to escape: the quotes and the text as it is */
        if (w_char(w, '"') < 0 || w_str(w, s, 1) < 0)
            return FAIL;
        w_put(w, '"');
        return OK;
    }
    for (Py_ssize_t i = first; i < n; i++) /* a lone surrogate anywhere: declined */
        if (escape_of(PyUnicode_READ(kind, data, i)) == 3)
            return DECLINE;
    if (w_char(w, '"') < 0)
        return FAIL;
    for (Py_ssize_t i = 0; i < n; i++) {
        Py_UCS4 c = PyUnicode_READ(kind, data, i);
        int e = i < first ? 0 : escape_of(c);
        if (e == 0) {
            Py_UCS4 level = level_of(c);
            if ((w->len == w->cap || level > w->maxchar) && w_prepare(w, 1, level) < 0)
                return FAIL;
            PyUnicode_WRITE(w->kind, w->buf, w->len, c);
            w->len++;
        } else if (e == 2) {
            char pair[2] = {'\\', c == '\n' ? 'n' : c == '\r' ? 'r' : c == '\t' ? 't' : (char)c};
            if (w_ascii(w, pair, 2) < 0)
                return FAIL;
        } else {
            static const char hex[] = "0123456789abcdef";
            char u[6] = {'\\', 'u', hex[(c >> 12) & 15], hex[(c >> 8) & 15], hex[(c >> 4) & 15],
                         hex[c & 15]};
            if (w_ascii(w, u, 6) < 0)
                return FAIL;
        }
    }
    return w_char(w, '"');
}

/* An int64 in decimal into buf (at least 21 bytes); its length. */
static Py_ssize_t
int_text(long long v, char *buf)
{
    char tmp[24];
    Py_ssize_t n = 0;
    unsigned long long u = v < 0 ? 0ULL - (unsigned long long)v : (unsigned long long)v;
    while (u >= 100) { /* two digits at a time, written backwards */
        unsigned d = (unsigned)(u % 100) * 2;
        u /= 100;
        tmp[n++] = DIGIT_PAIRS[d + 1];
        tmp[n++] = DIGIT_PAIRS[d];
    }
    do {
        tmp[n++] = (char)('0' + u % 10);
        u /= 10;
    } while (u);
    Py_ssize_t len = 0;
    if (v < 0)
        buf[len++] = '-';
    while (n)
        buf[len++] = tmp[--n];
    return len;
}

/* An exact int within int64 (DECLINE otherwise). */
static int
int64_of(PyObject *item, long long *out)
{
    int overflow;
    long long v = PyLong_AsLongLongAndOverflow(item, &overflow);
    if (overflow)
        return DECLINE;
    if (v == -1 && PyErr_Occurred())
        return FAIL;
    *out = v;
    return OK;
}

static inline int
w_atom(const EncodersState *enc, Writer *w, PyObject *item)
{
    PyTypeObject *type = Py_TYPE(item);
    if (type == &PyUnicode_Type)
        return w_quoted(w, item);
    if (type == enc->symbol || type == enc->uri)
        return w_str(w, item, 0);
    if (type == enc->keyword) {
        if (w_char(w, ':') < 0)
            return FAIL;
        return w_str(w, item, 0);
    }
    if (type == &PyLong_Type) {
        long long v;
        int r = int64_of(item, &v);
        if (r != OK)
            return r;
        if (w_room(w, 24, 127) < 0)
            return FAIL;
        if (w->kind == 1) {
            w->len += int_text(v, (char *)w->buf + w->len);
            return OK;
        }
        char buf[24];
        w_ascii_unchecked(w, buf, int_text(v, buf));
        return OK;
    }
    if (type == enc->decimal) {
        char buf[128];
        Py_ssize_t n;
        int r = decimal_text(enc, item, buf, &n);
        if (r != OK)
            return r;
        return w_ascii(w, buf, n);
    }
    return DECLINE; /* bool, None, a subclass, float ...: the Python twin raises or writes */
}

/* The canonical text of value, appended: the walk of canonical() below. The stack is
 * empty before and after (on an error or a decline the caller frees what is left). */
static int
w_value(const EncodersState *enc, Writer *w, Stack *stack, PyObject *value)
{
    int r;
    if (!IS_LIST(value))
        return w_atom(enc, w, value);
    if ((r = stack_push(stack, value)) != OK)
        return r;
    if (w_char(w, '(') < 0)
        return FAIL;
    Py_ssize_t base = stack->depth - 1;
    for (;;) {
        Frame *f = &stack->frames[stack->depth - 1];
        int first = f->index == 0;
        PyObject *item = stack_next(stack);
        if (item == NULL) {
            stack_pop(stack);
            if (w_char(w, ')') < 0)
                return FAIL;
            if (stack->depth == base)
                return OK;
            continue;
        }
        if (w_room(w, 2, 127) < 0)
            return FAIL;
        if (!first)
            w_put(w, ' ');
        if (IS_LIST(item)) {
            r = stack_push(stack, item);
            if (r == OK)
                w_put(w, '(');
        } else {
            r = w_atom(enc, w, item);
        }
        if (r != OK)
            return r;
    }
}

static PyObject *
canonical(PyObject *module, PyObject *value)
{
    NativeState *st = native_state(module);
    if (st == NULL)
        return NULL;
    const EncodersState *enc = &st->encoders;
    if (enc->max_decimal_chars < 0)
        Py_RETURN_NONE;
    Writer w;
    Stack stack;
    WRITER_INIT(w);
    STACK_INIT(stack);
    PyObject *result = NULL;
    int r = w_value(enc, &w, &stack, value);
    if (r == OK)
        result = w_finish(&w);
    else if (r == DECLINE) {
        result = Py_None;
        Py_INCREF(result);
    }
    stack_free(&stack);
    w_free(&w);
    return result;
}

/* ------------------------------------------------------------------------- messages */

/* cbcl.protocol._message.Message and Signature (dataclasses over the C types
 * MessageFields and SignatureFields: their fields are read from their structs, native.h),
 * set by setup_message(); NULL: every message is declined. */
enum {
    F_MESSAGE_ID, F_SENDER, F_RECEIVER, F_INTENT, F_PROTOCOL, F_CONVERSATION_ID,
    F_IN_REPLY_TO, F_REPLY_BY, F_TIMESTAMP, F_TRACE, F_BODY, F_SIGNATURE, N_FIELDS
};
static_assert(N_FIELDS == CBCL_MESSAGE_FIELDS, "message_fields_get: one per field");
/* In the state (enc): message, signature (strong references). The text's: text_names, the version symbol,
 * then the field symbols, in FIELD_ATTRS' order (a tuple of 1 + N_FIELDS exact Symbols);
 * text_intents, the intents as (member, symbol) pairs (Message.to_value's _INTENT_SYMBOL).
 * The frame's: frame_intents, the intents by code (cbcl.binary._codec.INTENTS),
 * frame_bits, the present bits of conversation-id, in-reply-to, reply-by, timestamp,
 * signature, body, trace; registry, cbcl.protocol._registry.Registry (encode_message). */

typedef struct {
    PyObject *f[N_FIELDS];  /* strong references */
    PyObject *sig[2];       /* the signature's key id and value (strong), or NULL */
} Fields;

static void
fields_release(Fields *m)
{
    for (int i = 0; i < N_FIELDS; i++)
        Py_CLEAR(m->f[i]);
    Py_CLEAR(m->sig[0]);
    Py_CLEAR(m->sig[1]);
}

/* The fields of an exact Message (and of its signature, an exact Signature or None), as
 * strong references (held: a lookup in the walk may run Python code); DECLINE for
 * anything else, or an unset field. */
static int
fields_read(const EncodersState *enc, PyObject *message, Fields *m)
{
    if (enc->message == NULL || Py_TYPE(message) != enc->message ||
            !message_fields_get(message, m->f))
        return DECLINE;
    m->sig[0] = m->sig[1] = NULL;
    PyObject *signature = m->f[F_SIGNATURE];
    if (signature != Py_None) {
        SignatureFieldsObject *s = (SignatureFieldsObject *)signature;
        if (Py_TYPE(signature) != enc->signature || s->key_id == NULL || s->value == NULL) {
            fields_release(m);
            return DECLINE;
        }
        m->sig[0] = Py_NewRef(s->key_id);
        m->sig[1] = Py_NewRef(s->value);
    }
    return OK;
}

/* Each field's " (name " as ASCII (enc->field_prefix, field_prefix_length), made by
 * setup_message from text_names (length 0: a name that is not short ASCII, written from
 * its symbol). */
#define FIELD_PREFIX_MAX CBCL_FIELD_PREFIX_MAX

/* " (name " value [" " second] ")" */
static int
w_field(const EncodersState *enc, Writer *w, Stack *stack, int index, PyObject *value,
        PyObject *second)
{
    if (enc->field_prefix_length[index] > 0) {
        if (w_ascii(w, enc->field_prefix[index], enc->field_prefix_length[index]) < 0)
            return FAIL;
    } else {
        PyObject *name = PyTuple_GET_ITEM(enc->text_names, 1 + index);
        if (w_ascii(w, " (", 2) < 0 || w_str(w, name, 1) < 0)
            return FAIL;
        w_put(w, ' ');
    }
    int r = w_value(enc, w, stack, value);
    if (r != OK)
        return r;
    if (second != NULL) {
        if (w_char(w, ' ') < 0)
            return FAIL;
        if ((r = w_value(enc, w, stack, second)) != OK)
            return r;
    }
    return w_char(w, ')');
}

/* The canonical text of Message.to_value(): the envelope list, fields in order, optional
 * ones when not None. */
static int
w_message(const EncodersState *enc, Writer *w, Stack *stack, Fields *m)
{
    PyObject *intent = NULL;
    for (Py_ssize_t i = 0; i < PyTuple_GET_SIZE(enc->text_intents); i++) {
        PyObject *pair = PyTuple_GET_ITEM(enc->text_intents, i);
        if (PyTuple_GET_ITEM(pair, 0) == m->f[F_INTENT]) {
            intent = PyTuple_GET_ITEM(pair, 1);
            break;
        }
    }
    if (intent == NULL)
        return DECLINE; /* not a member: _INTENT_SYMBOL[intent] decides (or raises) */
    int r;
    if (w_char(w, '(') < 0 || w_str(w, PyTuple_GET_ITEM(enc->text_names, 0), 0) < 0)
        return FAIL;
    for (int i = 0; i < F_SIGNATURE; i++) {
        PyObject *value = i == F_INTENT ? intent : m->f[i];
        if (i > F_PROTOCOL && value == Py_None)
            continue;
        if ((r = w_field(enc, w, stack, i, value, NULL)) != OK)
            return r;
    }
    if (m->f[F_SIGNATURE] != Py_None &&
        (r = w_field(enc, w, stack, F_SIGNATURE, m->sig[0], m->sig[1])) != OK)
        return r;
    return w_char(w, ')');
}

/* canonical_message's work: the text, None (declined) or NULL with an exception. */
static PyObject *
canonical_message_of(const EncodersState *enc, PyObject *message)
{
    Fields m;
    if (enc->max_decimal_chars < 0 || enc->text_names == NULL ||
            fields_read(enc, message, &m) != OK)
        Py_RETURN_NONE;
    Writer w;
    Stack stack;
    WRITER_INIT(w);
    STACK_INIT(stack);
    PyObject *result = NULL;
    int r = w_message(enc, &w, &stack, &m);
    if (r == OK)
        result = w_finish(&w);
    else if (r == DECLINE) {
        result = Py_None;
        Py_INCREF(result);
    }
    stack_free(&stack);
    w_free(&w);
    fields_release(&m);
    return result;
}

static PyObject *
canonical_message(PyObject *module, PyObject *message)
{
    NativeState *st = native_state(module);
    return st == NULL ? NULL : canonical_message_of(&st->encoders, message);
}

/* ------------------------------------------------------------------------- msgpack writer */

/* The frame is written to an inline buffer, then, once longer, into the bytes object it
 * will be (grown by _PyBytes_Resize, cut to its length at the end): a long frame is not
 * copied once more into its result. */
#define INLINE_BYTES 2048

typedef struct {
    char *buf; /* the inline buffer, or obj's data */
    Py_ssize_t len, cap;
    PyObject *obj; /* NULL while inline; then the bytes written into (strong) */
    char inline_buf[INLINE_BYTES];
} Bytes;

#define BYTES_INIT(b) ((b).buf = (b).inline_buf, (b).len = 0, (b).cap = INLINE_BYTES, \
                       (b).obj = NULL)

static void
b_free(Bytes *b)
{
    Py_CLEAR(b->obj);
    b->buf = NULL;
}

static int
b_grow(Bytes *b, Py_ssize_t extra)
{
    if (extra > PY_SSIZE_T_MAX / 4 - b->len) {
        PyErr_NoMemory();
        return FAIL;
    }
    Py_ssize_t need = b->len + extra, cap = 2 * b->cap;
    if (cap < need)
        cap = need;
    if (b->obj == NULL) {
        b->obj = PyBytes_FromStringAndSize(NULL, cap);
        if (b->obj == NULL)
            return FAIL;
        memcpy(PyBytes_AS_STRING(b->obj), b->buf, (size_t)b->len);
    } else if (_PyBytes_Resize(&b->obj, cap) < 0) {
        return FAIL; /* (b->obj is NULL: freed) */
    }
    b->buf = PyBytes_AS_STRING(b->obj);
    b->cap = cap;
    return OK;
}

/* Room for extra more bytes (the common case inline). */
static inline int
b_room(Bytes *b, Py_ssize_t extra)
{
    if (extra <= b->cap - b->len)
        return OK;
    return b_grow(b, extra);
}

static void
put_be(char *p, unsigned long long v, int n)
{
    for (int i = n - 1; i >= 0; i--) {
        p[i] = (char)(v & 0xff);
        v >>= 8;
    }
}

/* A msgpack integer in the smallest form, as msgpack.packb writes it, at p (room for 9
 * bytes); the end of what it wrote. */
static inline char *
put_int(char *p, long long v)
{
    int n;
    if (v >= 0) {
        if (v < 128) {
            p[0] = (char)v;
            return p + 1;
        }
        if (v < 256) {
            p[0] = (char)0xcc;
            n = 1;
        } else if (v < 65536) {
            p[0] = (char)0xcd;
            n = 2;
        } else if (v < 4294967296LL) {
            p[0] = (char)0xce;
            n = 4;
        } else {
            p[0] = (char)0xcf;
            n = 8;
        }
    } else {
        if (v >= -32) {
            p[0] = (char)(unsigned char)(v & 0xff);
            return p + 1;
        }
        if (v >= -128) {
            p[0] = (char)0xd0;
            n = 1;
        } else if (v >= -32768) {
            p[0] = (char)0xd1;
            n = 2;
        } else if (v >= -2147483648LL) {
            p[0] = (char)0xd2;
            n = 4;
        } else {
            p[0] = (char)0xd3;
            n = 8;
        }
    }
    put_be(p + 1, (unsigned long long)v, n);
    return p + 1 + n;
}

static int
mp_int_any(Bytes *b, long long v)
{
    if (b_room(b, 9) < 0)
        return FAIL;
    b->len = put_int(b->buf + b->len, v) - b->buf;
    return OK;
}

/* An int as msgpack writes it: mp_int_any, the usual one (a code, a parenthesis: a
 * positive fixint) inline. */
static inline int
mp_int(Bytes *b, long long v)
{
    if (v >= 0 && v < 128 && b->len < b->cap) {
        b->buf[b->len++] = (char)v;
        return OK;
    }
    return mp_int_any(b, v);
}

/* A msgpack str header of n bytes (fixstr, str8, str16 or str32; n < 2**32) at p (room
 * for 5 bytes); the end of what it wrote. */
static inline char *
put_str_header(char *p, Py_ssize_t n)
{
    if (n < 32) {
        *p++ = (char)(0xa0 | n);
    } else if (n < 256) {
        *p++ = (char)0xd9;
        *p++ = (char)n;
    } else if (n < 65536) {
        *p++ = (char)0xda;
        put_be(p, (unsigned long long)n, 2);
        p += 2;
    } else {
        *p++ = (char)0xdb;
        put_be(p, (unsigned long long)n, 4);
        p += 4;
    }
    return p;
}

/* The code `code` (an int, or -1: none), then a msgpack str of n bytes of UTF-8. */
static inline int
mp_coded_raw(Bytes *b, long code, const char *s, Py_ssize_t n)
{
    if ((unsigned long long)n > 0xffffffffULL)
        return DECLINE;
    if (b_room(b, n + 14) < 0)
        return FAIL;
    char *p = b->buf + b->len;
    if (code >= 0)
        p = put_int(p, code);
    p = put_str_header(p, n);
    copy_bytes(p, s, (size_t)n);
    b->len = (p - b->buf) + n;
    return OK;
}

/* The UTF-8 of a str that is not ASCII (see mp_coded_str). */
static int
mp_coded_str_utf8(Bytes *b, long code, PyObject *s)
{
    Py_ssize_t n;
    const char *utf8 = PyUnicode_AsUTF8AndSize(s, &n);
    if (utf8 == NULL) {
        if (!PyErr_ExceptionMatches(PyExc_UnicodeEncodeError))
            return FAIL;
        PyErr_Clear();
        return DECLINE;
    }
    return mp_coded_raw(b, code, utf8, n);
}

/* The code `code` (or -1: none), then any str (subclasses too, as msgpack packs them):
 * its UTF-8; a lone surrogate declines. */
static inline int
mp_coded_str(Bytes *b, long code, PyObject *s)
{
    if (READY(s) < 0)
        return FAIL;
    if (PyUnicode_IS_ASCII(s)) /* its UTF-8 is its data */
        return mp_coded_raw(b, code, (const char *)PyUnicode_1BYTE_DATA(s),
                            PyUnicode_GET_LENGTH(s));
    return mp_coded_str_utf8(b, code, s);
}

static int
mp_str(Bytes *b, PyObject *s)
{
    return mp_coded_str(b, -1, s);
}

/* A symbol table's codes (prepare, below): an open addressing table of exact Symbol,
 * Keyword and URI objects (strong references), equal when of one type and one text
 * (cbcl.core._values._Atom.__eq__). */
typedef struct {
    PyObject *key;
    Py_hash_t hash; /* key's */
    long code;
} Entry;

/* The arrays of a frame's learned names (Learned, below), kept between frames. */
typedef struct {
    PyObject **keys;
    Py_hash_t *hashes;
    Py_ssize_t capacity; /* of keys and hashes */
    int32_t *index;
    Py_ssize_t index_capacity; /* slots of index */
} LearnedArrays;

typedef struct {
    Entry *slots; /* NULL until the first name, then on the heap */
    Py_ssize_t used, mask; /* mask + 1 slots, a power of two */
    /* The arrays its last frame with many learned names
     * used, lent to the next such frame (spare_lent while one holds them), so a body of
     * thousands of new names does not allocate, zero and rehash a table again each time.
     * Bounded: arrays for more than SPARE_MAX_NAMES names are freed, not kept. */
    LearnedArrays spare;
    int spare_lent;
} Names;

static int
same_atom(PyObject *a, PyObject *b)
{
    if (a == b)
        return 1;
    if (Py_TYPE(a) != Py_TYPE(b) || READY(a) < 0 || READY(b) < 0) {
        PyErr_Clear();
        return 0;
    }
    Py_ssize_t n = PyUnicode_GET_LENGTH(a);
    int kind = PyUnicode_KIND(a);
    return n == PyUnicode_GET_LENGTH(b) && kind == PyUnicode_KIND(b) &&
           memcmp(PyUnicode_DATA(a), PyUnicode_DATA(b), (size_t)n * (size_t)kind) == 0;
}

/* A str's hash: the one it caches, once computed (str.__hash__: Symbol, Keyword and URI
 * keep it, cbcl.core._values._Atom.__hash__). */
static inline Py_hash_t
str_hash(PyObject *s)
{
    Py_hash_t h = ((PyASCIIObject *)s)->hash;
    return h != -1 ? h : PyObject_Hash(s);
}

/* The slot of key (hash h): the one holding it, or the empty one it would take. */
static Entry *
names_probe(Names *t, PyObject *key, Py_hash_t h)
{
    size_t i = (size_t)h & (size_t)t->mask;
    for (;;) {
        Entry *e = &t->slots[i];
        if (e->key == NULL || (e->hash == h && same_atom(e->key, key)))
            return e;
        i = (i + 1) & (size_t)t->mask;
    }
}

/* names_probe, its usual outcome inline: the very object (interned names are shared), or
 * an empty slot, at the first place looked. */
static inline Entry *
names_slot(Names *t, PyObject *key, Py_hash_t h)
{
    Entry *e = &t->slots[(size_t)h & (size_t)t->mask];
    if (e->key == key || e->key == NULL)
        return e;
    return names_probe(t, key, h);
}

static int
names_grow(Names *t)
{
    Py_ssize_t size = t->slots ? 2 * (t->mask + 1) : 64;
    Entry *old = t->slots;
    Py_ssize_t old_size = old ? t->mask + 1 : 0;
    t->slots = PyMem_Calloc((size_t)size, sizeof(Entry));
    if (t->slots == NULL) {
        t->slots = old;
        PyErr_NoMemory();
        return FAIL;
    }
    t->mask = size - 1;
    for (Py_ssize_t i = 0; i < old_size; i++) {
        if (old[i].key != NULL) {
            *names_slot(t, old[i].key, old[i].hash) = old[i];
        }
    }
    PyMem_Free(old);
    return OK;
}

static void
learned_arrays_free(LearnedArrays *a)
{
    PyMem_Free(a->keys);
    PyMem_Free(a->hashes);
    PyMem_Free(a->index);
    *a = (LearnedArrays){NULL, NULL, 0, NULL, 0};
}

static void
names_free(Names *t)
{
    if (t->slots != NULL) {
        for (Py_ssize_t i = 0; i <= t->mask; i++)
            Py_XDECREF(t->slots[i].key);
        PyMem_Free(t->slots);
        t->slots = NULL;
    }
    learned_arrays_free(&t->spare);
}

/* The names a frame writes in full, in the order they take their codes (the k-th:
 * C_FIRST + the table's size + k): strong references in keys[k], their hashes in
 * hashes[k]. Up to LEARNED_INLINE they are told apart by a scan of the inline arrays;
 * past that, through `index`, open addressing over int32 positions (k + 1; 0 is empty)
 * with at least twice as many slots as names, so that growing moves 4 bytes a slot and
 * never a key. The heap arrays are borrowed from the symbol table's spare when it has
 * them (Names.spare), and given back after the frame. */
#define LEARNED_INLINE 8
#define SPARE_MAX_NAMES (1 << 14)

typedef struct {
    LearnedArrays a; /* keys and hashes point at the inline arrays until they are full */
    Py_ssize_t count;
    Py_ssize_t mask; /* index has mask + 1 slots in use; -1: no index (a scan) */
    Names *owner;    /* the symbol table lending its spare, if a.keys is it */
    PyObject *inline_keys[LEARNED_INLINE];
    Py_hash_t inline_hashes[LEARNED_INLINE];
} Learned;

static void
learned_init(Learned *l)
{
    l->a = (LearnedArrays){l->inline_keys, l->inline_hashes, LEARNED_INLINE, NULL, 0};
    l->count = 0;
    l->mask = -1;
    l->owner = NULL;
}

/* The position of `item` (hash h) among the learned names, or -1; then, where they are
 * indexed, *empty is the index slot it would take (learned_add's, unless it reindexes). */
static inline Py_ssize_t
learned_find(const Learned *l, PyObject *item, Py_hash_t h, size_t *empty)
{
    PyObject *const *keys = l->a.keys;
    const Py_hash_t *hashes = l->a.hashes;
    if (l->mask < 0) {
        for (Py_ssize_t k = 0; k < l->count; k++)
            if (keys[k] == item || (hashes[k] == h && same_atom(keys[k], item)))
                return k;
        return -1;
    }
    size_t i = (size_t)h & (size_t)l->mask;
    for (;;) {
        int32_t pos = l->a.index[i];
        if (pos == 0) {
            *empty = i;
            return -1;
        }
        Py_ssize_t k = pos - 1;
        if (keys[k] == item || (hashes[k] == h && same_atom(keys[k], item)))
            return k;
        i = (i + 1) & (size_t)l->mask;
    }
}

/* index rebuilt with `slots` slots (a power of two above twice count), every name placed. */
static int
learned_reindex(Learned *l, Py_ssize_t slots)
{
    if (slots > l->a.index_capacity) {
        PyMem_Free(l->a.index);
        l->a.index = PyMem_Malloc((size_t)slots * sizeof(int32_t));
        l->a.index_capacity = l->a.index ? slots : 0;
        if (l->a.index == NULL) {
            PyErr_NoMemory();
            return FAIL;
        }
    }
    memset(l->a.index, 0, (size_t)slots * sizeof(int32_t));
    l->mask = slots - 1;
    for (Py_ssize_t k = 0; k < l->count; k++) { /* (distinct: no key compared) */
        size_t i = (size_t)l->a.hashes[k] & (size_t)l->mask;
        while (l->a.index[i] != 0)
            i = (i + 1) & (size_t)l->mask;
        l->a.index[i] = (int32_t)(k + 1);
    }
    return OK;
}

/* Room for one more name in keys and hashes: the inline arrays, then the symbol table's
 * spare (if it is free and has room), then the heap, doubling. */
static int
learned_room(Learned *l, Names *codes)
{
    if (l->count < l->a.capacity)
        return OK;
    if (l->count > INT32_MAX / 4) {
        PyErr_NoMemory();
        return FAIL;
    }
    if (l->a.keys == l->inline_keys) {
        LearnedArrays got = {NULL, NULL, 0, NULL, 0};
        if (!codes->spare_lent && codes->spare.capacity > LEARNED_INLINE) {
            got = codes->spare;
            codes->spare = (LearnedArrays){NULL, NULL, 0, NULL, 0};
            codes->spare_lent = 1;
            l->owner = codes;
        } else {
            got.keys = PyMem_Malloc(8 * LEARNED_INLINE * sizeof(PyObject *));
            got.hashes = PyMem_Malloc(8 * LEARNED_INLINE * sizeof(Py_hash_t));
            got.capacity = 8 * LEARNED_INLINE;
            if (got.keys == NULL || got.hashes == NULL) {
                learned_arrays_free(&got);
                PyErr_NoMemory();
                return FAIL;
            }
        }
        memcpy(got.keys, l->inline_keys, sizeof l->inline_keys);
        memcpy(got.hashes, l->inline_hashes, sizeof l->inline_hashes);
        l->a = got;
        return OK;
    }
    Py_ssize_t capacity = 2 * l->a.capacity;
    PyObject **keys = PyMem_Realloc(l->a.keys, (size_t)capacity * sizeof(PyObject *));
    if (keys == NULL) {
        PyErr_NoMemory();
        return FAIL;
    }
    l->a.keys = keys;
    Py_hash_t *hashes = PyMem_Realloc(l->a.hashes, (size_t)capacity * sizeof(Py_hash_t));
    if (hashes == NULL) {
        PyErr_NoMemory();
        return FAIL;
    }
    l->a.hashes = hashes;
    l->a.capacity = capacity;
    return OK;
}

/* `item` (hash h) learned: the next position. `empty` is the index slot learned_find
 * gave (when there is an index). */
static int
learned_add(Learned *l, Names *codes, PyObject *item, Py_hash_t h, size_t empty)
{
    if (learned_room(l, codes) < 0)
        return FAIL;
    Py_ssize_t k = l->count++;
    l->a.keys[k] = Py_NewRef(item);
    l->a.hashes[k] = h;
    if (l->count <= LEARNED_INLINE)
        return OK;
    if (l->mask < 0 || 2 * l->count > l->mask + 1) {
        Py_ssize_t slots = l->mask < 0 ? 4 * LEARNED_INLINE : 2 * (l->mask + 1);
        return learned_reindex(l, slots);
    }
    l->a.index[empty] = (int32_t)(k + 1);
    return OK;
}

/* The frame's names released; the heap arrays given to the symbol table as its spare when
 * it has none and they are not too big, else freed. */
static void
learned_release(Learned *l, Names *codes)
{
    for (Py_ssize_t k = 0; k < l->count; k++)
        Py_DECREF(l->a.keys[k]);
    if (l->a.keys == l->inline_keys)
        return;
    if (l->owner != NULL)
        l->owner->spare_lent = 0;
    if (codes->spare.keys == NULL && !codes->spare_lent && l->a.capacity <= SPARE_MAX_NAMES &&
            l->a.index_capacity <= 4 * SPARE_MAX_NAMES) {
        codes->spare = l->a;
    } else {
        learned_arrays_free(&l->a);
    }
    learned_init(l);
}

/* An exact Symbol, Keyword or URI: its code if the table or this frame has one, else it
 * is written in full (its kind's code, then its text) and takes the next code. */
static int
mp_name(const EncodersState *enc, Bytes *b, PyObject *item, long kind_code, Names *codes,
        Learned *learned)
{
    Py_hash_t h = str_hash(item);
    if (h == -1)
        return FAIL;
    if (READY(item) < 0)
        return FAIL;
    /* A name is in the table or learned, never both: the table first (a protocol's own
     * names, a record's members, are most of a body's). */
    Entry *e = names_slot(codes, item, h);
    if (e->key != NULL)
        return mp_int(b, e->code);
    size_t empty = 0;
    Py_ssize_t k = learned->count ? learned_find(learned, item, h, &empty) : -1;
    if (k >= 0)
        return mp_int(b, enc->c_first + (long)codes->used + (long)k);
    if (learned_add(learned, codes, item, h, empty) < 0)
        return FAIL;
    return mp_coded_str(b, kind_code, item);
}

/* An int within int64 (DECLINE otherwise) as its code and msgpack integer; one of at most
 * two digits read from the object (CPython's layout), any other by the C API. */
static inline int
mp_integer(const EncodersState *enc, Bytes *b, PyObject *item)
{
    long long v;
#if PY_VERSION_HEX >= 0x030C0000
    if (PyUnstable_Long_IsCompact((PyLongObject *)item)) {
        v = (long long)PyUnstable_Long_CompactValue((PyLongObject *)item);
    } else
#else
    Py_ssize_t size = Py_SIZE(item);
    const digit *d = ((PyLongObject *)item)->ob_digit;
    if (size >= -1 && size <= 1) {
        v = (long long)size * (long long)d[0];
    } else if (size == 2 || size == -2) {
        long long u = (long long)d[0] | ((long long)d[1] << PyLong_SHIFT);
        v = size < 0 ? -u : u;
    } else
#endif
    {
        int r = int64_of(item, &v);
        if (r != OK)
            return r;
    }
    if (b_room(b, 10) < 0)
        return FAIL;
    char *p = put_int(b->buf + b->len, enc->c_integer);
    b->len = put_int(p, v) - b->buf;
    return OK;
}

/* A decimal's code and text, written in place. */
static int
mp_decimal(const EncodersState *enc, Bytes *b, PyObject *item)
{
    DecimalText t;
    int r = decimal_size(enc, item, &t);
    if (r != OK)
        return r;
    if (b_room(b, t.length + 11) < 0)
        return FAIL;
    char *p = put_str_header(put_int(b->buf + b->len, enc->c_decimal), t.length);
    decimal_write(&t, p);
    b->len = (p - b->buf) + t.length;
    return OK;
}

/* An atom of type `type` (not a list). */
static inline int
mp_atom_of(const EncodersState *enc, Bytes *b, PyObject *item, PyTypeObject *type,
           Names *codes, Learned *names)
{
    if (type == enc->keyword)
        return mp_name(enc, b, item, enc->c_keyword, codes, names);
    if (type == enc->symbol)
        return mp_name(enc, b, item, enc->c_symbol, codes, names);
    if (type == &PyUnicode_Type)
        return mp_str(b, item);
    if (type == enc->decimal)
        return mp_decimal(enc, b, item);
    if (type == &PyLong_Type)
        return mp_integer(enc, b, item);
    if (type == enc->uri)
        return mp_name(enc, b, item, enc->c_uri, codes, names);
    return DECLINE;
}

static inline int
mp_atom(const EncodersState *enc, Bytes *b, PyObject *item, Names *codes, Learned *names)
{
    return mp_atom_of(enc, b, item, Py_TYPE(item), codes, names);
}

/* The body's tokens. The walk reads the innermost list's items in a loop of its own (a
 * tuple's size and items once: it cannot change; a list's again at each item, as Python
 * code a lookup may run could change it), and goes back to the stack only to enter or
 * leave a list. */
static int
mp_body(const EncodersState *enc, Bytes *b, PyObject *body, Names *codes)
{
    Learned names;
    learned_init(&names);
    Stack stack;
    STACK_INIT(stack);
    int r;
    if (!IS_LIST(body)) {
        r = mp_atom(enc, b, body, codes, &names);
        goto end;
    }
    if ((r = stack_push(&stack, body)) != OK || (r = mp_int(b, enc->c_lpar)) != OK)
        goto end;
    while (stack.depth) {
        Frame *f = &stack.frames[stack.depth - 1];
        PyObject *seq = f->seq, *item = NULL;
        Py_ssize_t i = f->index;
        if (PyTuple_CheckExact(seq)) {
            PyObject *const *items = &PyTuple_GET_ITEM(seq, 0);
            Py_ssize_t n = PyTuple_GET_SIZE(seq);
            if (i == 0) /* entered: its first items asked for at once */
                for (Py_ssize_t k = 0; k < n && k < PREFETCH_AHEAD; k++)
                    PREFETCH(items[k]);
            for (; i < n; i++) {
                /* The walk is bound by the first touch of each item (its type): ask for
                 * one further on while this one is written. */
                if (i + PREFETCH_AHEAD < n)
                    PREFETCH(items[i + PREFETCH_AHEAD]);
                PyTypeObject *type = Py_TYPE(items[i]);
                if (type == &PyTuple_Type || type == &PyList_Type) {
                    item = items[i];
                    break;
                }
                if ((r = mp_atom_of(enc, b, items[i], type, codes, &names)) != OK)
                    goto end;
            }
        } else {
            for (; i < PyList_GET_SIZE(seq); i++) {
                PyObject *next = PyList_GET_ITEM(seq, i);
                PyTypeObject *type = Py_TYPE(next);
                if (type == &PyTuple_Type || type == &PyList_Type) {
                    item = next;
                    break;
                }
                if ((r = mp_atom_of(enc, b, next, type, codes, &names)) != OK)
                    goto end;
            }
        }
        if (item == NULL) { /* the end of the list */
            stack_pop(&stack);
            if ((r = mp_int(b, enc->c_rpar)) != OK)
                goto end;
            continue;
        }
        f->index = i + 1;
        if ((r = stack_push(&stack, item)) != OK || (r = mp_int(b, enc->c_lpar)) != OK)
            goto end;
    }
    r = OK;
end:
    stack_free(&stack);
    learned_release(&names, codes);
    return r;
}

/* ------------------------------------------------------------------------- tables */

static const char TABLE[] = "cbcl._native.table";

static void
table_free(PyObject *capsule)
{
    Names *t = PyCapsule_GetPointer(capsule, TABLE);
    if (t != NULL) {
        names_free(t);
        PyMem_Free(t);
    }
}

/* A symbol table's codes (cbcl.binary._codec.SymbolTable.codes) as pack_frame reads them: an
 * opaque capsule, or None when a key is not an exact Symbol, Keyword or URI or a code is
 * not an int (then the Python twin writes every frame). Its used count is len(codes). */
static PyObject *
prepare(PyObject *module, PyObject *codes)
{
    NativeState *st = native_state(module);
    if (st == NULL)
        return NULL;
    const EncodersState *enc = &st->encoders;
    if (enc->max_decimal_chars < 0 || !PyDict_CheckExact(codes))
        Py_RETURN_NONE;
    Names *t = PyMem_Calloc(1, sizeof(Names));
    if (t == NULL)
        return PyErr_NoMemory();
    PyObject *key, *value;
    Py_ssize_t pos = 0;
    while (PyDict_Next(codes, &pos, &key, &value)) {
        PyTypeObject *type = Py_TYPE(key);
        long code;
        if ((type != enc->symbol && type != enc->keyword && type != enc->uri) ||
            !PyLong_CheckExact(value))
            goto decline;
        code = PyLong_AsLong(value);
        if (code == -1 && PyErr_Occurred()) {
            PyErr_Clear();
            goto decline;
        }
        if (t->slots == NULL || 2 * (t->used + 1) > t->mask + 1) {
            if (names_grow(t) < 0)
                goto fail;
        }
        Py_hash_t h = PyObject_Hash(key);
        if (h == -1 || READY(key) < 0)
            goto fail;
        Entry *e = names_slot(t, key, h);
        if (e->key != NULL)
            goto decline; /* equal keys: not a dict of atoms */
        Py_INCREF(key);
        e->key = key;
        e->hash = h;
        e->code = code;
        t->used++;
    }
    if (t->slots == NULL && names_grow(t) < 0)
        goto fail;
    PyObject *capsule = PyCapsule_New(t, TABLE, table_free);
    if (capsule == NULL)
        goto fail;
    return capsule;
decline:
    names_free(t);
    PyMem_Free(t);
    Py_RETURN_NONE;
fail:
    names_free(t);
    PyMem_Free(t);
    return NULL;
}

/* An envelope token as msgpack.packb writes it: an int within int64 or any str (a
 * subclass too); anything else declines. */
static int
mp_token(Bytes *b, PyObject *token)
{
    if (PyLong_CheckExact(token)) {
        long long v;
        int r = int64_of(token, &v);
        if (r == OK)
            r = mp_int(b, v);
        return r;
    }
    if (PyUnicode_Check(token))
        return mp_str(b, token);
    return DECLINE;
}

static int
b_header(Bytes *b, PyObject *header)
{
    Py_ssize_t size = PyBytes_GET_SIZE(header);
    if (b_room(b, size) < 0)
        return FAIL;
    memcpy(b->buf, PyBytes_AS_STRING(header), (size_t)size);
    b->len = size;
    return OK;
}

static PyObject *
b_finish(Bytes *b, int r)
{
    PyObject *result = NULL;
    if (r == OK && b->obj != NULL) { /* the bytes written into, cut to the frame */
        if (_PyBytes_Resize(&b->obj, b->len) == 0) {
            result = b->obj;
            b->obj = NULL;
        }
    } else if (r == OK)
        result = PyBytes_FromStringAndSize(b->buf, b->len);
    else if (r == DECLINE) {
        result = Py_None;
        Py_INCREF(result);
    }
    b_free(b);
    return result;
}

static PyObject *
pack_frame(PyObject *module, PyObject *const *args, Py_ssize_t nargs)
{
    NativeState *st = native_state(module);
    if (st == NULL)
        return NULL;
    const EncodersState *enc = &st->encoders;
    if (nargs != 4) {
        PyErr_SetString(PyExc_TypeError, "pack_frame takes 4 positional arguments");
        return NULL;
    }
    PyObject *header = args[0], *tokens = args[1], *body = args[2];
    if (enc->max_decimal_chars < 0 || !PyBytes_CheckExact(header) ||
        !PyList_CheckExact(tokens) || !PyCapsule_IsValid(args[3], TABLE))
        Py_RETURN_NONE;
    Names *codes = PyCapsule_GetPointer(args[3], TABLE);
    if (codes == NULL)
        return NULL;
    Bytes b;
    BYTES_INIT(b);
    int r = b_header(&b, header);
    /* the envelope: what msgpack.packb(tokens) writes of ints and strs */
    for (Py_ssize_t i = 0; r == OK && i < PyList_GET_SIZE(tokens); i++)
        r = mp_token(&b, PyList_GET_ITEM(tokens, i));
    if (r == OK && body != Py_None)
        r = mp_body(enc, &b, body, codes);
    return b_finish(&b, r);
}

/* The tokens of Encoder.encode: intent, present, message-id, sender, receiver, the optional
 * fields that are not None, the trace, the signature's two strings, then the body's
 * tokens. */
static int
mp_message(const EncodersState *enc, Bytes *b, Fields *m, Names *codes)
{
    long intent = -1;
    for (Py_ssize_t i = 0; i < PyTuple_GET_SIZE(enc->frame_intents); i++) {
        if (PyTuple_GET_ITEM(enc->frame_intents, i) == m->f[F_INTENT]) {
            intent = (long)i;
            break;
        }
    }
    if (intent < 0)
        return DECLINE; /* not a member: _INTENT_INDEX[intent] decides (or raises) */
    static const int optional[CBCL_FRAME_BITS] = {F_CONVERSATION_ID, F_IN_REPLY_TO, F_REPLY_BY,
                                    F_TIMESTAMP, F_SIGNATURE, F_BODY, F_TRACE};
    long present = 0;
    for (int i = 0; i < CBCL_FRAME_BITS; i++)
        if (m->f[optional[i]] != Py_None)
            present |= enc->frame_bits[i];
    int r;
    if ((r = mp_int(b, intent)) != OK || (r = mp_int(b, present)) != OK)
        return r;
    for (int i = F_MESSAGE_ID; i <= F_RECEIVER; i++)
        if ((r = mp_token(b, m->f[i])) != OK)
            return r;
    for (int i = 0; i < 4; i++) {
        PyObject *value = m->f[optional[i]];
        if (value != Py_None && (r = mp_token(b, value)) != OK)
            return r;
    }
    if (m->f[F_TRACE] != Py_None && (r = mp_token(b, m->f[F_TRACE])) != OK)
        return r;
    if (m->f[F_SIGNATURE] != Py_None &&
        ((r = mp_token(b, m->sig[0])) != OK || (r = mp_token(b, m->sig[1])) != OK))
        return r;
    if (m->f[F_BODY] != Py_None)
        return mp_body(enc, b, m->f[F_BODY], codes);
    return OK;
}

static PyObject *
pack_message(PyObject *module, PyObject *const *args, Py_ssize_t nargs)
{
    NativeState *st = native_state(module);
    if (st == NULL)
        return NULL;
    const EncodersState *enc = &st->encoders;
    if (nargs != 3) {
        PyErr_SetString(PyExc_TypeError, "pack_message takes 3 positional arguments");
        return NULL;
    }
    PyObject *header = args[0];
    Fields m;
    if (enc->max_decimal_chars < 0 || enc->frame_intents == NULL ||
        !PyBytes_CheckExact(header) || !PyCapsule_IsValid(args[2], TABLE) ||
        fields_read(enc, args[1], &m) != OK)
        Py_RETURN_NONE;
    Names *codes = PyCapsule_GetPointer(args[2], TABLE);
    Bytes b;
    BYTES_INIT(b);
    int r = codes == NULL ? FAIL : b_header(&b, header);
    if (r == OK)
        r = mp_message(enc, &b, &m, codes);
    fields_release(&m);
    return b_finish(&b, r);
}

/* The (header, prepared table) of message's protocol in an Encoder's cache: protocols (an
 * exact cbcl.Registry's _protocols_by_id(), protocols_of) holds the protocol under the
 * message's exact Symbol, as Registry.get finds it, and tables (Encoder._tables) maps that
 * protocol to (SymbolTable, header, prepared). DECLINE for anything else: a protocol
 * unknown or not cached yet (Encoder._table then finds it, or raises). *header and
 * *capsule are strong references (the table lives while a frame is written). */
static int
cached_table(const EncodersState *enc, PyObject *protocols, PyObject *tables,
             PyObject *symbol, PyObject **header, PyObject **capsule)
{
    if (Py_TYPE(symbol) != enc->symbol || !PyDict_CheckExact(tables) ||
        !PyDict_CheckExact(protocols))
        return DECLINE;
    /* (a lookup may run Symbol.__eq__, Python code: the result is held) */
    PyObject *protocol = PyDict_GetItemWithError(protocols, symbol);
    if (protocol == NULL) {
        PyErr_Clear(); /* the Python path meets the same error again, or the None */
        return DECLINE;
    }
    Py_INCREF(protocol);
    /* a Protocol hashes by identity (eq=False): no Python code runs here */
    PyObject *cached = PyDict_GetItemWithError(tables, protocol);
    Py_DECREF(protocol);
    if (cached == NULL) {
        PyErr_Clear();
        return DECLINE;
    }
    if (PyTuple_CheckExact(cached) && PyTuple_GET_SIZE(cached) == 3 &&
        PyBytes_CheckExact(PyTuple_GET_ITEM(cached, 1)) &&
        PyCapsule_CheckExact(PyTuple_GET_ITEM(cached, 2))) { /* (its name: checked below) */
        *header = PyTuple_GET_ITEM(cached, 1);
        *capsule = PyTuple_GET_ITEM(cached, 2);
        Py_INCREF(*header);
        Py_INCREF(*capsule);
        return OK;
    }
    return DECLINE;
}

/* The registry's dict of loaded protocols (Registry._protocols_by_id(), a strong
 * reference), or NULL (no exception) if registry is not an exact cbcl.Registry. */
static PyObject *
protocols_of(const EncodersState *enc, PyObject *registry)
{
    if (enc->registry == NULL || Py_TYPE(registry) != enc->registry)
        return NULL;
    PyObject *protocols = PyObject_CallMethodNoArgs(registry, enc->s_protocols);
    if (protocols == NULL)
        PyErr_Clear();
    else if (!PyDict_CheckExact(protocols))
        Py_CLEAR(protocols);
    return protocols;
}

/* encode_message's work: the frame, None (declined) or NULL with an exception. */
static PyObject *
encode_message_of(const EncodersState *enc, PyObject *message, PyObject *protocols,
                  PyObject *tables)
{
    Fields m;
    if (enc->max_decimal_chars < 0 || enc->frame_intents == NULL || enc->registry == NULL ||
        fields_read(enc, message, &m) != OK)
        Py_RETURN_NONE;
    PyObject *header = NULL, *capsule = NULL;
    Bytes b;
    BYTES_INIT(b);
    int r = cached_table(enc, protocols, tables, m.f[F_PROTOCOL], &header, &capsule);
    if (r == OK)
        r = b_header(&b, header);
    if (r == OK) {
        Names *codes = PyCapsule_GetPointer(capsule, TABLE);
        if (codes == NULL) { /* another capsule (None: pure_python=True is not one) */
            PyErr_Clear();
            r = DECLINE;
        } else {
            r = mp_message(enc, &b, &m, codes);
        }
    }
    Py_XDECREF(header);
    Py_XDECREF(capsule);
    fields_release(&m);
    return b_finish(&b, r);
}

static PyObject *
encode_message(PyObject *module, PyObject *const *args, Py_ssize_t nargs)
{
    NativeState *st = native_state(module);
    if (st == NULL)
        return NULL;
    const EncodersState *enc = &st->encoders;
    if (nargs != 3) {
        PyErr_SetString(PyExc_TypeError, "encode_message takes 3 positional arguments");
        return NULL;
    }
    PyObject *protocols = protocols_of(enc, args[1]);
    if (protocols == NULL)
        Py_RETURN_NONE;
    PyObject *frame = encode_message_of(enc, args[0], protocols, args[2]);
    Py_DECREF(protocols);
    return frame;
}

/* ------------------------------------------------------------------------- entries */

/* Message.canonical and Encoder.encode as C methods (cbcl/_native_src/entry.h): the text or
 * frame of canonical_message / encode_message, else the Python method they stand in for. */

static PyObject *message_canonical(NativeState *st, PyObject *self, PyObject *const *args,
                                   Py_ssize_t nargs, PyObject *kwnames);
static PyObject *encoder_encode(NativeState *st, PyObject *self, PyObject *const *args,
                                Py_ssize_t nargs, PyObject *kwnames);

static int encoder_bind(NativeState *st, PyTypeObject *owner);

/* (the templates of st->encoders.canonical_entry and encode_entry) */
static const CEntry CANONICAL_ENTRY = {
    {"canonical", NULL, METH_NOARGS, NULL}, message_canonical, NULL, NULL, NULL};
static const CEntry ENCODE_ENTRY = {
    {"encode", NULL, METH_FASTCALL | METH_KEYWORDS, NULL}, encoder_encode, encoder_bind,
    NULL, NULL};

/* cbcl._native.EncoderFields: the storage of what encoder_encode reads of an Encoder
 * (cbcl.binary._codec.Encoder is a class over it), as named members of its struct:
 * validate, registry, _tables, _registry_protocols. Writable (the Encoder's __init__ sets
 * them, and a user may set validate or registry later), GC-tracked, no __dict__; a class
 * over it may add slots (the Encoder's others, __weakref__). st->encoders.encoder_type is
 * the class encode_entry was bound in, where that class is over it (encoder_bind); NULL:
 * every call falls back. */
typedef struct {
    PyObject_HEAD
    PyObject *validate, *registry, *tables, *registry_protocols; /* strong; NULL: unset */
} EncoderFieldsObject;

static PyMemberDef encoder_fields_members[] = {
    {"validate", Py_T_OBJECT_EX, offsetof(EncoderFieldsObject, validate), 0, NULL},
    {"registry", Py_T_OBJECT_EX, offsetof(EncoderFieldsObject, registry), 0, NULL},
    {"_tables", Py_T_OBJECT_EX, offsetof(EncoderFieldsObject, tables), 0, NULL},
    {"_registry_protocols", Py_T_OBJECT_EX, offsetof(EncoderFieldsObject, registry_protocols),
     0, NULL},
    {NULL, 0, 0, 0, NULL},
};

static int
encoder_fields_traverse(PyObject *self, visitproc visit, void *arg)
{
    EncoderFieldsObject *e = (EncoderFieldsObject *)self;
    Py_VISIT(Py_TYPE(self));
    Py_VISIT(e->validate);
    Py_VISIT(e->registry);
    Py_VISIT(e->tables);
    Py_VISIT(e->registry_protocols);
    return 0;
}

static int
encoder_fields_clear(PyObject *self)
{
    EncoderFieldsObject *e = (EncoderFieldsObject *)self;
    Py_CLEAR(e->validate);
    Py_CLEAR(e->registry);
    Py_CLEAR(e->tables);
    Py_CLEAR(e->registry_protocols);
    return 0;
}

static void
encoder_fields_dealloc(PyObject *self)
{
    PyTypeObject *type = Py_TYPE(self);
    PyObject_GC_UnTrack(self);
    encoder_fields_clear(self);
    type->tp_free(self);
    Py_DECREF(type);
}

static PyType_Slot encoder_fields_slots[] = {
    {Py_tp_doc, "The storage of what cbcl.binary._codec.Encoder.encode's C entry reads: "
                "validate, registry, _tables, _registry_protocols as named members."},
    {Py_tp_traverse, encoder_fields_traverse},
    {Py_tp_clear, encoder_fields_clear},
    {Py_tp_dealloc, encoder_fields_dealloc},
    {Py_tp_members, encoder_fields_members},
    {0, NULL},
};

static PyType_Spec encoder_fields_spec = {
    .name = "cbcl._native.EncoderFields",
    .basicsize = sizeof(EncoderFieldsObject),
    .flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_BASETYPE | Py_TPFLAGS_HAVE_GC |
             Py_TPFLAGS_IMMUTABLETYPE,
    .slots = encoder_fields_slots,
};

static PyObject *
message_canonical(NativeState *st, PyObject *self, PyObject *const *Py_UNUSED(args),
                  Py_ssize_t Py_UNUSED(nargs), PyObject *Py_UNUSED(kwnames))
{
    PyObject *text = canonical_message_of(&st->encoders, self);
    if (text != Py_None)
        return text; /* (or NULL: an exception) */
    Py_DECREF(text);
    PyObject *fallback = entry_fallback(&st->encoders.canonical_entry);
    return fallback == NULL ? NULL : PyObject_CallOneArg(fallback, self);
}

/* encoder.encode(message): one positional argument, validate=False and the fields set:
 * encode_message with the encoder's registry and tables (read from its EncoderFields
 * struct: self is an instance of the class encode_entry was bound in, checked by the
 * MethodEntry, which encoder_bind found to be over EncoderFields). */
static PyObject *
encoder_encode(NativeState *st, PyObject *self, PyObject *const *args, Py_ssize_t nargs,
               PyObject *kwnames)
{
    EncodersState *enc = &st->encoders;
    if (nargs == 1 && kwnames == NULL && enc->encoder_type != NULL && enc->registry != NULL &&
            (Py_TYPE(self) == enc->encoder_type ||
             PyObject_TypeCheck(self, enc->encoder_fields_type))) {
        EncoderFieldsObject *fields = (EncoderFieldsObject *)self;
        PyObject *frame = Py_None; /* (borrowed while None: nothing written) */
        /* (held: the Python code a lookup may run could set them) */
        PyObject *registry = Py_XNewRef(fields->registry), *tables = Py_XNewRef(fields->tables);
        PyObject *pair = Py_XNewRef(fields->registry_protocols);
        /* validate=True: outgoing.c's check first, in this call (its refusals and doubts
         * are the Python method's, which raises the reference's error) */
        int validated = fields->validate == Py_True;
        Py_ssize_t max_bytes = PY_SSIZE_T_MAX;
        if ((fields->validate != Py_False && !validated) || registry == NULL ||
                tables == NULL || !PyDict_CheckExact(tables))
            goto release;
        /* the registry's protocols as the encoder was made with them (registry, those
         * without constraints, all), while its registry is that one: all of them when
         * nothing is validated (no rule is checked), else those the check may accept;
         * else read from the registry (_protocols_by_id(): one with constraints goes
         * to the Python method) */
        PyObject *protocols;
        if (pair != NULL && PyTuple_CheckExact(pair) && PyTuple_GET_SIZE(pair) == 3 &&
                PyTuple_GET_ITEM(pair, 0) == registry)
            protocols = Py_NewRef(PyTuple_GET_ITEM(pair, validated ? 1 : 2));
        else
            protocols = protocols_of(enc, registry);
        if (protocols != NULL) {
            int ok = validated ? cbcl_outgoing_encoder_accepts(st, self, args[0], protocols,
                                                               &max_bytes) : 1;
            if (ok < 0)
                frame = NULL;
            else if (ok == 1) { /* (a new reference) */
                frame = encode_message_of(enc, args[0], protocols, tables);
                if (frame == Py_None)
                    Py_DECREF(frame);
            }
            Py_DECREF(protocols);
            if (frame != Py_None && frame != NULL && PyBytes_GET_SIZE(frame) > max_bytes) {
                Py_DECREF(frame); /* over the limit: the Python method raises */
                frame = Py_None;
            }
        }
    release:
        Py_XDECREF(registry);
        Py_XDECREF(tables);
        Py_XDECREF(pair);
        if (frame != Py_None)
            return frame; /* (or NULL: an exception) */
    }
    return entry_call_method(&enc->encode_entry, self, args, nargs, kwnames);
}

/* canonical_entry(fallback, doc) -> MethodEntry: Message.canonical in C, the object the
 * class body binds (module.c); until setup_message has found the Message type every call
 * falls back. */
static PyObject *
canonical_entry(PyObject *module, PyObject *args)
{
    NativeState *st = native_state(module);
    if (st == NULL)
        return NULL;
    PyObject *fallback, *doc;
    if (!PyArg_ParseTuple(args, "OU", &fallback, &doc))
        return NULL;
    if (entry_set(&st->encoders.canonical_entry, fallback, doc) < 0)
        return NULL;
    return cbcl_method_entry(st, &st->encoders.canonical_entry);
}

/* encode_entry's bind: the class, where it is over EncoderFields (its fields read from
 * the struct); else none, and every call falls back. */
static int
encoder_bind(NativeState *st, PyTypeObject *owner)
{
    EncodersState *enc = &st->encoders;
    PyTypeObject *bound = enc->encoder_fields_type != NULL &&
                          PyType_IsSubtype(owner, enc->encoder_fields_type) ? owner : NULL;
    Py_XSETREF(enc->encoder_type, (PyTypeObject *)Py_XNewRef((PyObject *)bound));
    return 0;
}

/* encode_entry(fallback, doc) -> MethodEntry: Encoder.encode in C, the object the class
 * body binds (module.c; encoder_bind finds its slots when the class is made). */
static PyObject *
encode_entry(PyObject *module, PyObject *args)
{
    NativeState *st = native_state(module);
    if (st == NULL)
        return NULL;
    PyObject *fallback, *doc;
    if (!PyArg_ParseTuple(args, "OU", &fallback, &doc))
        return NULL;
    if (entry_set(&st->encoders.encode_entry, fallback, doc) < 0)
        return NULL;
    return cbcl_method_entry(st, &st->encoders.encode_entry);
}

/* ------------------------------------------------------------------------- setup */

static PyObject *
setup(PyObject *module, PyObject *args)
{
    NativeState *st = native_state(module);
    if (st == NULL)
        return NULL;
    EncodersState *enc = &st->encoders;
    PyObject *symbol, *keyword, *uri, *decimal;
    Py_ssize_t max_decimal;
    long lpar, rpar, integer, dec, sym, kw, u, first;
    if (!PyArg_ParseTuple(args, "O!O!O!O!n(llllllll)", &PyType_Type, &symbol, &PyType_Type,
                          &keyword, &PyType_Type, &uri, &PyType_Type, &decimal, &max_decimal,
                          &lpar, &rpar, &integer, &dec, &sym, &kw, &u, &first))
        return NULL;
    if (max_decimal < 1 || max_decimal > 100) {
        PyErr_SetString(PyExc_ValueError, "max_decimal_chars must be from 1 to 100");
        return NULL;
    }
    if (!PyType_IsSubtype((PyTypeObject *)symbol, &PyUnicode_Type) ||
        !PyType_IsSubtype((PyTypeObject *)keyword, &PyUnicode_Type) ||
        !PyType_IsSubtype((PyTypeObject *)uri, &PyUnicode_Type)) {
        PyErr_SetString(PyExc_TypeError, "Symbol, Keyword and URI must be str subclasses");
        return NULL;
    }
    Py_INCREF(symbol);
    Py_INCREF(keyword);
    Py_INCREF(uri);
    Py_INCREF(decimal);
    Py_XSETREF(enc->symbol, (PyTypeObject *)symbol);
    Py_XSETREF(enc->keyword, (PyTypeObject *)keyword);
    Py_XSETREF(enc->uri, (PyTypeObject *)uri);
    Py_XSETREF(enc->decimal, (PyTypeObject *)decimal);
    enc->decimal_layout = 0;
    enc->decimal_layout = decimal_layout_holds(enc->decimal);
    enc->c_lpar = lpar;
    enc->c_rpar = rpar;
    enc->c_integer = integer;
    enc->c_decimal = dec;
    enc->c_symbol = sym;
    enc->c_keyword = kw;
    enc->c_uri = u;
    enc->c_first = first;
    enc->max_decimal_chars = max_decimal;
    return PyBool_FromLong(enc->decimal_layout);
}

/* Whether `type` is `base` (this module's MessageFields or SignatureFields) or a class
 * over it that adds nothing to its instances (`size`, its struct's: no __dict__, no
 * __weakref__, no slot), so that the struct is the whole of an instance's fields. */
static int
fields_layout(PyTypeObject *base, PyTypeObject *type, size_t size)
{
    return base != NULL && PyType_IsSubtype(type, base) &&
           type->tp_basicsize == (Py_ssize_t)size && type->tp_itemsize == 0 &&
           type->tp_dictoffset == 0 && type->tp_weaklistoffset == 0;
}

static PyObject *
setup_message(PyObject *module, PyObject *args)
{
    NativeState *st = native_state(module);
    if (st == NULL)
        return NULL;
    EncodersState *enc = &st->encoders;
    PyObject *message, *signature, *names, *intents;
    if (!PyArg_ParseTuple(args, "O!O!O!O!", &PyType_Type, &message, &PyType_Type, &signature,
                          &PyTuple_Type, &names, &PyTuple_Type, &intents))
        return NULL;
    if (enc->symbol == NULL) {
        PyErr_SetString(PyExc_RuntimeError, "setup() must run first");
        return NULL;
    }
    if (PyTuple_GET_SIZE(names) != 1 + N_FIELDS)
        Py_RETURN_FALSE;
    for (Py_ssize_t i = 0; i < PyTuple_GET_SIZE(names); i++)
        if (Py_TYPE(PyTuple_GET_ITEM(names, i)) != enc->symbol)
            Py_RETURN_FALSE;
    for (Py_ssize_t i = 0; i < PyTuple_GET_SIZE(intents); i++) {
        PyObject *pair = PyTuple_GET_ITEM(intents, i);
        if (!PyTuple_CheckExact(pair) || PyTuple_GET_SIZE(pair) != 2 ||
            Py_TYPE(PyTuple_GET_ITEM(pair, 1)) != enc->symbol)
            Py_RETURN_FALSE;
    }
    if (!fields_layout(st->message_fields_type, (PyTypeObject *)message,
                       sizeof(MessageFieldsObject)) ||
            !fields_layout(st->signature_fields_type, (PyTypeObject *)signature,
                           sizeof(SignatureFieldsObject)))
        Py_RETURN_FALSE;
    Py_INCREF(message);
    Py_INCREF(signature);
    Py_INCREF(names);
    Py_INCREF(intents);
    Py_XSETREF(enc->message, (PyTypeObject *)message);
    Py_XSETREF(enc->signature, (PyTypeObject *)signature);
    Py_XSETREF(enc->text_names, names);
    Py_XSETREF(enc->text_intents, intents);
    for (int i = 0; i < N_FIELDS; i++) {
        PyObject *name = PyTuple_GET_ITEM(names, 1 + i);
        Py_ssize_t n = PyUnicode_GET_LENGTH(name);
        char *prefix = enc->field_prefix[i];
        enc->field_prefix_length[i] = 0;
        if (READY(name) < 0)
            return NULL;
        if (PyUnicode_IS_ASCII(name) && n + 3 <= FIELD_PREFIX_MAX) {
            prefix[0] = ' ';
            prefix[1] = '(';
            memcpy(prefix + 2, PyUnicode_1BYTE_DATA(name), (size_t)n);
            prefix[n + 2] = ' ';
            enc->field_prefix_length[i] = n + 3;
        }
    }
    Py_RETURN_TRUE;
}

static PyObject *
setup_frame(PyObject *module, PyObject *args)
{
    NativeState *st = native_state(module);
    if (st == NULL)
        return NULL;
    EncodersState *enc = &st->encoders;
    PyObject *intents, *registry;
    long bits[CBCL_FRAME_BITS];
    if (!PyArg_ParseTuple(args, "O!(lllllll)O!", &PyTuple_Type, &intents, &bits[0], &bits[1],
                          &bits[2], &bits[3], &bits[4], &bits[5], &bits[6], &PyType_Type,
                          &registry))
        return NULL;
    for (int i = 0; i < CBCL_FRAME_BITS; i++) {
        if (bits[i] < 1 || bits[i] > 0x7f) {
            PyErr_SetString(PyExc_ValueError, "present bits must be from 1 to 127");
            return NULL;
        }
    }
    memcpy(enc->frame_bits, bits, sizeof(bits));
    Py_INCREF(intents);
    Py_INCREF(registry);
    Py_XSETREF(enc->frame_intents, intents);
    Py_XSETREF(enc->registry, (PyTypeObject *)registry);
    Py_RETURN_NONE;
}

PyMethodDef cbcl_encoders_methods[] = {
    {"canonical", canonical, METH_O,
     "canonical(value, /) -> str | None: the canonical text of a value, or None to decline."},
    {"pack_frame", (PyCFunction)(void (*)(void))pack_frame, METH_FASTCALL,
     "pack_frame(header, tokens, body, table, /) -> bytes | None: a binary frame, or None "
     "to decline (table: what prepare(codes) returned)."},
    {"canonical_message", canonical_message, METH_O,
     "canonical_message(message, /) -> str | None: Message.canonical()'s text, or None to "
     "decline."},
    {"pack_message", (PyCFunction)(void (*)(void))pack_message, METH_FASTCALL,
     "pack_message(header, message, table, /) -> bytes | None: Encoder.encode()'s frame of "
     "a message, or None to decline (table: what prepare(codes) returned)."},
    {"encode_message", (PyCFunction)(void (*)(void))encode_message, METH_FASTCALL,
     "encode_message(message, registry, tables, /) -> bytes | None: pack_message with the "
     "header and table an Encoder cached for the message's protocol (Encoder._tables), or "
     "None to decline (not cached yet, a Registry subclass ...)."},
    {"setup_message", setup_message, METH_VARARGS,
     "setup_message(Message, Signature, names, intents, /) -> bool: the message types, the "
     "envelope's symbols and the intents' (member, symbol) pairs; False: not laid out over "
     "MessageFields and SignatureFields (every message is declined)."},
    {"setup_frame", setup_frame, METH_VARARGS,
     "setup_frame(intents, present_bits, Registry, /): the intents by code, the present "
     "bits of conversation-id, in-reply-to, reply-by, timestamp, signature, body and "
     "trace, and "
     "the registry type whose _protocols_by_id() encode_message reads."},
    {"canonical_entry", canonical_entry, METH_VARARGS,
     "canonical_entry(fallback, doc, /) -> MethodEntry: Message.canonical in C, falling "
     "back to the Python method (cbcl/_native_src/entry.h), for Message's class body."},
    {"encode_entry", encode_entry, METH_VARARGS,
     "encode_entry(fallback, doc, /) -> MethodEntry: Encoder.encode in C, falling back to "
     "the Python method (cbcl/_native_src/entry.h), for Encoder's class body; where the "
     "class does not keep the slots it reads, every call falls back."},
    {"prepare", prepare, METH_O,
     "prepare(codes, /) -> object | None: a symbol table's codes as pack_frame takes them."},
    {"setup", setup, METH_VARARGS,
     "setup(Symbol, Keyword, URI, Decimal, max_decimal_chars, codes, /) -> bool: the types "
     "and constants of cbcl.core._values and cbcl.core._vocabulary; whether Decimals are read from "
     "their layout (else from their text)."},
    {NULL, NULL, 0, NULL},
};

/* The section's part of the state as if no setup had run (every twin declines), the
 * entries' templates copied into it, "_protocols_by_id" interned (module.c's exec). */
int
cbcl_encoders_exec(PyObject *module, NativeState *st)
{
    EncodersState *enc = &st->encoders;
    PyObject *type = PyType_FromModuleAndSpec(module, &encoder_fields_spec, NULL);
    if (type == NULL)
        return -1;
    enc->encoder_fields_type = (PyTypeObject *)type; /* (strong: the state's) */
    if (PyModule_AddObjectRef(module, "EncoderFields", type) < 0)
        return -1;
    enc->max_decimal_chars = -1;
    for (int i = 0; i < CBCL_FRAME_BITS; i++)
        enc->frame_bits[i] = -1;
    enc->canonical_entry = CANONICAL_ENTRY;
    enc->encode_entry = ENCODE_ENTRY;
    enc->s_protocols = PyUnicode_InternFromString("_protocols_by_id");
    return enc->s_protocols == NULL ? -1 : 0;
}

int
cbcl_encoders_traverse(NativeState *st, visitproc visit, void *arg)
{
    EncodersState *enc = &st->encoders;
    Py_VISIT(enc->symbol);
    Py_VISIT(enc->keyword);
    Py_VISIT(enc->uri);
    Py_VISIT(enc->decimal);
    Py_VISIT(enc->message);
    Py_VISIT(enc->signature);
    Py_VISIT(enc->registry);
    Py_VISIT(enc->text_names);
    Py_VISIT(enc->text_intents);
    Py_VISIT(enc->frame_intents);
    Py_VISIT(enc->s_protocols);
    CBCL_VISIT_ENTRY(enc->canonical_entry);
    CBCL_VISIT_ENTRY(enc->encode_entry);
    Py_VISIT(enc->encoder_fields_type);
    Py_VISIT(enc->encoder_type);
    return 0;
}

void
cbcl_encoders_clear(NativeState *st)
{
    EncodersState *enc = &st->encoders;
    enc->max_decimal_chars = -1; /* (every twin declines) */
    Py_CLEAR(enc->symbol);
    Py_CLEAR(enc->keyword);
    Py_CLEAR(enc->uri);
    Py_CLEAR(enc->decimal);
    Py_CLEAR(enc->message);
    Py_CLEAR(enc->signature);
    Py_CLEAR(enc->registry);
    Py_CLEAR(enc->text_names);
    Py_CLEAR(enc->text_intents);
    Py_CLEAR(enc->frame_intents);
    Py_CLEAR(enc->s_protocols);
    CBCL_CLEAR_ENTRY(enc->canonical_entry);
    CBCL_CLEAR_ENTRY(enc->encode_entry);
    Py_CLEAR(enc->encoder_fields_type);
    Py_CLEAR(enc->encoder_type);
}
