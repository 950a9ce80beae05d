/* Optional accelerator of the encoders: canonical text (cbcl/_canonical.py) and the binary
 * frame writer (cbcl/_codec.py).
 *
 * Theory of operation
 * -------------------
 * Two functions, each the C twin of Python code that stays the reference and the fallback
 * when this module is not built:
 *
 *   canonical(value)                        -> str | None
 *       twin of cbcl._canonical._canonical_value_python
 *   pack_frame(header, tokens, body, table) -> bytes | None
 *       twin of the tail of cbcl._codec.Encoder.encode: header + msgpack of the envelope
 *       tokens + the body's tokens (cbcl._codec._body_tokens), as msgpack.packb writes them;
 *       table is prepare(codes), a symbol table's codes held as a C hash table
 *
 * The symbol table and the atoms a frame writes in full are looked up in C hash tables
 * keyed by exact Symbol, Keyword and URI objects, equal when of one type and one text, as
 * cbcl._values._Atom.__eq__ has them: no Python code runs during a walk.
 *
 * Both serve only the ordinary case and raise nothing for anything in their input: on any
 * doubt (a type that is not exactly a CBCL type - bool, a subclass, a float -, an integer
 * outside int64, a lone surrogate, a non-finite or over-long decimal, nesting deeper than
 * MAX_DEPTH, a string over 4 GiB ...) they return None and the Python twin writes the same
 * value again, or raises exactly the error it always raised. Exceptions come only from the
 * interpreter (MemoryError).
 *
 * Both walks are iterative: an explicit stack of (container, next index) frames, each
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
 * Decimals are written from their scientific text (str(d), which _decimal computes in C
 * and keeps short: "1E+999999" is 9 characters), read back into sign, coefficient digits
 * and exponent, sized before anything is written (the Python twin's rule), then written in
 * positional notation with at least one fractional digit.
 *
 * setup() gives the module the types and constants it needs (cbcl/_canonical.py calls it
 * when it imports this module), so nothing here can drift from cbcl._values and
 * cbcl._vocabulary.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <string.h>

#define MAX_DEPTH 10000

static PyTypeObject *T_SYMBOL, *T_KEYWORD, *T_URI, *T_DECIMAL;
static Py_ssize_t MAX_DECIMAL_CHARS = -1; /* -1: setup() has not run; everything declines */
static long C_LPAR, C_RPAR, C_INTEGER, C_DECIMAL, C_SYMBOL, C_KEYWORD, C_URI, C_FIRST;

/* Outcomes of the helpers: OK, DECLINE (the Python twin takes over), FAIL (an exception
 * is set). */
enum { OK = 0, DECLINE = 1, FAIL = -1 };

/* ------------------------------------------------------------------------- the stack */

typedef struct {
    PyObject *seq; /* a strong reference: an exact tuple or list */
    Py_ssize_t index;
} Frame;

typedef struct {
    Frame *frames;
    Py_ssize_t depth, cap;
} Stack;

static int
stack_push(Stack *s, PyObject *seq)
{
    if (s->depth >= MAX_DEPTH)
        return DECLINE;
    if (s->depth == s->cap) {
        Py_ssize_t cap = s->cap ? s->cap * 2 : 32;
        Frame *frames = PyMem_Realloc(s->frames, (size_t)cap * sizeof(Frame));
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
    PyMem_Free(s->frames);
    s->frames = NULL;
    s->depth = s->cap = 0;
}

/* The next item of the innermost container (borrowed: no Python code runs while it is
 * used, but for a Decimal's str(), around which it is held), or NULL at its end. */
static PyObject *
stack_next(Stack *s)
{
    Frame *f = &s->frames[s->depth - 1];
    PyObject *seq = f->seq, *item;
    if (PyTuple_CheckExact(seq)) {
        if (f->index >= PyTuple_GET_SIZE(seq))
            return NULL;
        item = PyTuple_GET_ITEM(seq, f->index);
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

/* The canonical text of an exact Decimal (twin of cbcl._canonical._decimal), written to
 * out (at least MAX_DECIMAL_CHARS + 1 bytes), its length in *size; DECLINE for a
 * non-finite or over-long one. */
static int
decimal_text(PyObject *value, char *out, Py_ssize_t *size)
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
    int sign = 0;
    if (i < n && s[i] == '-') {
        sign = 1;
        i++;
    }
    /* the coefficient: digits with at most one point; "Infinity", "NaN", "sNaN" decline */
    char digits[64];
    Py_ssize_t ndigits = 0, fraction = 0;
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
        if (ndigits == 0 && c == '0')
            continue; /* leading zeros are not coefficient digits */
        if (ndigits >= (Py_ssize_t)sizeof(digits))
            goto done; /* more digits than any decimal within MAX_DECIMAL_CHARS has */
        digits[ndigits++] = c;
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
    exponent -= fraction;
    int zero = ndigits == 0;
    if (zero)
        digits[ndigits++] = '0';
    /* the size first, as the Python twin computes it */
    long long length;
    if (exponent >= 0) {
        length = sign + (zero ? 1 : ndigits + exponent) + 2;
    } else {
        long long whole = ndigits + exponent;
        length = sign + (whole > 1 ? whole : 1) + 1 - exponent;
    }
    if (length > MAX_DECIMAL_CHARS)
        goto done;
    char *p = out;
    if (sign)
        *p++ = '-';
    if (exponent >= 0) {
        memcpy(p, digits, (size_t)ndigits);
        p += ndigits;
        if (!zero) {
            memset(p, '0', (size_t)exponent);
            p += exponent;
        }
        *p++ = '.';
        *p++ = '0';
    } else {
        long long whole = ndigits + exponent;
        if (whole > 0) {
            memcpy(p, digits, (size_t)whole);
            p += whole;
            *p++ = '.';
            memcpy(p, digits + whole, (size_t)(ndigits - whole));
            p += ndigits - whole;
        } else {
            *p++ = '0';
            *p++ = '.';
            memset(p, '0', (size_t)(-whole));
            p += -whole;
            memcpy(p, digits, (size_t)ndigits);
            p += ndigits;
        }
    }
    *size = p - out;
    result = OK;
done:
    Py_DECREF(str);
    return result;
}

/* ------------------------------------------------------------------------- text writer */

typedef struct {
    void *buf;
    int kind; /* 1, 2 or 4 bytes per character */
    Py_UCS4 maxchar; /* 127, 255, 65535 or 1114111: the kind (and ASCII-ness) of the result */
    Py_ssize_t len, cap; /* in characters */
} Writer;

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
            void *buf = PyMem_Realloc(w->buf, (size_t)cap * (size_t)kind);
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
    PyMem_Free(w->buf);
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
        memcpy((char *)w->buf + w->len, s, (size_t)n);
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
static int
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
        memcpy((char *)w->buf + w->len * kind, data, (size_t)n * (size_t)kind);
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

/* Characters a canonical string escapes (cbcl._canonical._NEEDS_ESCAPE): 0 none, 1 the
 * \uXXXX escape, 2 a short escape, 3 a lone surrogate (declined). */
static unsigned char ESCAPE1[256];

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
        for (Py_ssize_t i = 0; i < n; i++) {
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

static int
w_atom(Writer *w, PyObject *item)
{
    PyTypeObject *type = Py_TYPE(item);
    if (type == &PyUnicode_Type)
        return w_quoted(w, item);
    if (type == T_SYMBOL || type == T_URI)
        return w_str(w, item, 0);
    if (type == T_KEYWORD) {
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
    if (type == T_DECIMAL) {
        char buf[128];
        Py_ssize_t n;
        int r = decimal_text(item, buf, &n);
        if (r != OK)
            return r;
        return w_ascii(w, buf, n);
    }
    return DECLINE; /* bool, None, a subclass, float ...: the Python twin raises or writes */
}

static PyObject *
canonical(PyObject *self, PyObject *value)
{
    (void)self;
    if (MAX_DECIMAL_CHARS < 0)
        Py_RETURN_NONE;
    Writer w = {NULL, 1, 127, 0, 0};
    Stack stack = {NULL, 0, 0};
    PyObject *result = NULL;
    int r;
    if (w_prepare(&w, 256, 127) < 0)
        goto fail;
    if (!IS_LIST(value)) {
        r = w_atom(&w, value);
        goto end;
    }
    r = stack_push(&stack, value);
    if (r != OK)
        goto end;
    if ((r = w_char(&w, '(')) != OK)
        goto end;
    for (;;) {
        Frame *f = &stack.frames[stack.depth - 1];
        int first = f->index == 0;
        PyObject *item = stack_next(&stack);
        if (item == NULL) {
            stack_pop(&stack);
            if ((r = w_char(&w, ')')) != OK)
                goto end;
            if (stack.depth == 0)
                break;
            continue;
        }
        if (w_room(&w, 2, 127) < 0) {
            r = FAIL;
            goto end;
        }
        if (!first)
            w_put(&w, ' ');
        if (IS_LIST(item)) {
            r = stack_push(&stack, item);
            if (r == OK)
                w_put(&w, '(');
        } else {
            r = w_atom(&w, item);
        }
        if (r != OK)
            goto end;
    }
    r = OK;
end:
    if (r == OK)
        result = w_finish(&w);
    else if (r == DECLINE) {
        result = Py_None;
        Py_INCREF(result);
    }
fail:
    stack_free(&stack);
    PyMem_Free(w.buf);
    return result;
}

/* ------------------------------------------------------------------------- msgpack writer */

typedef struct {
    char *buf;
    Py_ssize_t len, cap;
} Bytes;

static int
b_room(Bytes *b, Py_ssize_t extra)
{
    if (extra <= b->cap - b->len)
        return OK;
    if (extra > PY_SSIZE_T_MAX / 4 - b->len) {
        PyErr_NoMemory();
        return FAIL;
    }
    Py_ssize_t need = b->len + extra, cap = 2 * b->cap;
    if (cap < need)
        cap = need;
    char *buf = PyMem_Realloc(b->buf, (size_t)cap);
    if (buf == NULL) {
        PyErr_NoMemory();
        return FAIL;
    }
    b->buf = buf;
    b->cap = cap;
    return OK;
}

static void
put_be(char *p, unsigned long long v, int n)
{
    for (int i = n - 1; i >= 0; i--) {
        p[i] = (char)(v & 0xff);
        v >>= 8;
    }
}

/* A msgpack integer in the smallest form, as msgpack.packb writes it. */
static int
mp_int(Bytes *b, long long v)
{
    if (v >= 0 && v < 128 && b->len < b->cap) {
        b->buf[b->len++] = (char)v;
        return OK;
    }
    if (b_room(b, 9) < 0)
        return FAIL;
    char *p = b->buf + b->len;
    int n;
    if (v >= 0) {
        if (v < 128) {
            p[0] = (char)v;
            b->len += 1;
            return OK;
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
            b->len += 1;
            return OK;
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
    b->len += 1 + n;
    return OK;
}

/* A msgpack str (fixstr, str8, str16 or str32) of n bytes of UTF-8. */
static int
mp_raw(Bytes *b, const char *s, Py_ssize_t n)
{
    if ((unsigned long long)n > 0xffffffffULL)
        return DECLINE;
    if (b_room(b, n + 5) < 0)
        return FAIL;
    char *p = b->buf + b->len;
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
    memcpy(p, s, (size_t)n);
    b->len = (p - b->buf) + n;
    return OK;
}

/* Any str (subclasses too, as msgpack packs them): its UTF-8; a lone surrogate declines. */
static int
mp_str(Bytes *b, PyObject *s)
{
    if (READY(s) < 0)
        return FAIL;
    if (PyUnicode_IS_ASCII(s)) /* its UTF-8 is its data */
        return mp_raw(b, (const char *)PyUnicode_1BYTE_DATA(s), PyUnicode_GET_LENGTH(s));
    Py_ssize_t n;
    const char *utf8 = PyUnicode_AsUTF8AndSize(s, &n);
    if (utf8 == NULL) {
        if (!PyErr_ExceptionMatches(PyExc_UnicodeEncodeError))
            return FAIL;
        PyErr_Clear();
        return DECLINE;
    }
    return mp_raw(b, utf8, n);
}

/* Codes of the atoms written in full in this frame, after the symbol table's: an open
 * addressing table of exact Symbol, Keyword and URI objects (strong references), equal when
 * of one type and one text (cbcl._values._Atom.__eq__). */
typedef struct {
    PyObject *key;
    long code;
} Entry;

typedef struct {
    Entry *slots;
    Py_ssize_t used, mask; /* mask + 1 slots, a power of two */
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

/* The slot of key (hash h): the one holding it, or the empty one it would take. */
static Entry *
names_slot(Names *t, PyObject *key, Py_hash_t h)
{
    size_t i = (size_t)h & (size_t)t->mask;
    for (;;) {
        Entry *e = &t->slots[i];
        if (e->key == NULL || same_atom(e->key, key))
            return e;
        i = (i + 1) & (size_t)t->mask;
    }
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
            Py_hash_t h = PyObject_Hash(old[i].key); /* a str's: cached, never fails */
            *names_slot(t, old[i].key, h) = old[i];
        }
    }
    PyMem_Free(old);
    return OK;
}

static void
names_free(Names *t)
{
    if (t->slots != NULL) {
        for (Py_ssize_t i = 0; i <= t->mask; i++)
            Py_XDECREF(t->slots[i].key);
        PyMem_Free(t->slots);
    }
}

/* An exact Symbol, Keyword or URI: its code if the table or this frame has one, else it
 * is written in full (its kind's code, then its text) and takes the next code. */
static int
mp_name(Bytes *b, PyObject *item, long kind_code, Names *codes, Names *names)
{
    Py_hash_t h = PyObject_Hash(item); /* a str's, cached */
    if (h == -1)
        return FAIL;
    if (READY(item) < 0)
        return FAIL;
    Entry *e = names_slot(codes, item, h);
    if (e->key != NULL)
        return mp_int(b, e->code);
    if (names->slots == NULL || 2 * (names->used + 1) > names->mask + 1) {
        if (names_grow(names) < 0)
            return FAIL;
    }
    e = names_slot(names, item, h);
    if (e->key != NULL)
        return mp_int(b, e->code);
    /* new: the Python twin's codes[item] = FIRST_ENTRY + len(codes), codes growing */
    Py_INCREF(item);
    e->key = item;
    e->code = C_FIRST + (long)codes->used + (long)names->used;
    names->used++;
    if (mp_int(b, kind_code) < 0)
        return FAIL;
    return mp_str(b, item);
}

static int
mp_atom(Bytes *b, PyObject *item, Names *codes, Names *names)
{
    PyTypeObject *type = Py_TYPE(item);
    if (type == &PyUnicode_Type)
        return mp_str(b, item);
    if (type == T_SYMBOL)
        return mp_name(b, item, C_SYMBOL, codes, names);
    if (type == T_KEYWORD)
        return mp_name(b, item, C_KEYWORD, codes, names);
    if (type == T_URI)
        return mp_name(b, item, C_URI, codes, names);
    if (type == &PyLong_Type) {
        long long v;
        int r = int64_of(item, &v);
        if (r != OK)
            return r;
        if (mp_int(b, C_INTEGER) < 0)
            return FAIL;
        return mp_int(b, v);
    }
    if (type == T_DECIMAL) {
        char buf[128];
        Py_ssize_t n;
        int r = decimal_text(item, buf, &n);
        if (r != OK)
            return r;
        if (mp_int(b, C_DECIMAL) < 0)
            return FAIL;
        return mp_raw(b, buf, n);
    }
    return DECLINE;
}

static int
mp_body(Bytes *b, PyObject *body, Names *codes)
{
    Names names = {NULL, 0, 0};
    Stack stack = {NULL, 0, 0};
    int r;
    if (!IS_LIST(body)) {
        r = mp_atom(b, body, codes, &names);
        goto end;
    }
    if ((r = stack_push(&stack, body)) != OK || (r = mp_int(b, C_LPAR)) != OK)
        goto end;
    while (stack.depth) {
        PyObject *item = stack_next(&stack);
        if (item == NULL) {
            stack_pop(&stack);
            if ((r = mp_int(b, C_RPAR)) != OK)
                goto end;
            continue;
        }
        if (IS_LIST(item)) {
            r = stack_push(&stack, item);
            if (r == OK)
                r = mp_int(b, C_LPAR);
        } else {
            r = mp_atom(b, item, codes, &names);
        }
        if (r != OK)
            goto end;
    }
    r = OK;
end:
    stack_free(&stack);
    names_free(&names);
    return r;
}

/* ------------------------------------------------------------------------- tables */

static const char TABLE[] = "cbcl._encoders.table";

static void
table_free(PyObject *capsule)
{
    Names *t = PyCapsule_GetPointer(capsule, TABLE);
    if (t != NULL) {
        names_free(t);
        PyMem_Free(t);
    }
}

/* A symbol table's codes (cbcl._codec.SymbolTable.codes) as pack_frame reads them: an
 * opaque capsule, or None when a key is not an exact Symbol, Keyword or URI or a code is
 * not an int (then the Python twin writes every frame). Its used count is len(codes). */
static PyObject *
prepare(PyObject *self, PyObject *codes)
{
    (void)self;
    if (MAX_DECIMAL_CHARS < 0 || !PyDict_CheckExact(codes))
        Py_RETURN_NONE;
    Names *t = PyMem_Calloc(1, sizeof(Names));
    if (t == NULL)
        return PyErr_NoMemory();
    PyObject *key, *value;
    Py_ssize_t pos = 0;
    while (PyDict_Next(codes, &pos, &key, &value)) {
        PyTypeObject *type = Py_TYPE(key);
        long code;
        if ((type != T_SYMBOL && type != T_KEYWORD && type != T_URI) ||
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

static PyObject *
pack_frame(PyObject *self, PyObject *const *args, Py_ssize_t nargs)
{
    (void)self;
    if (nargs != 4) {
        PyErr_SetString(PyExc_TypeError, "pack_frame takes 4 positional arguments");
        return NULL;
    }
    PyObject *header = args[0], *tokens = args[1], *body = args[2];
    if (MAX_DECIMAL_CHARS < 0 || !PyBytes_CheckExact(header) || !PyList_CheckExact(tokens) ||
        !PyCapsule_IsValid(args[3], TABLE))
        Py_RETURN_NONE;
    Names *codes = PyCapsule_GetPointer(args[3], TABLE);
    if (codes == NULL)
        return NULL;
    Py_ssize_t size = PyBytes_GET_SIZE(header);
    Bytes b = {NULL, 0, 0};
    int r = b_room(&b, size + 512);
    if (r != OK)
        goto end;
    memcpy(b.buf, PyBytes_AS_STRING(header), (size_t)size);
    b.len = size;
    /* the envelope: what msgpack.packb(tokens) writes of ints and strs */
    for (Py_ssize_t i = 0; i < PyList_GET_SIZE(tokens); i++) {
        PyObject *token = PyList_GET_ITEM(tokens, i);
        if (PyLong_CheckExact(token)) {
            long long v;
            r = int64_of(token, &v);
            if (r == OK)
                r = mp_int(&b, v);
        } else if (PyUnicode_Check(token)) {
            r = mp_str(&b, token);
        } else {
            r = DECLINE;
        }
        if (r != OK)
            goto end;
    }
    if (body != Py_None)
        r = mp_body(&b, body, codes);
end:;
    PyObject *result = NULL;
    if (r == OK)
        result = PyBytes_FromStringAndSize(b.buf, b.len);
    else if (r == DECLINE) {
        result = Py_None;
        Py_INCREF(result);
    }
    PyMem_Free(b.buf);
    return result;
}

/* ------------------------------------------------------------------------- setup */

static PyObject *
setup(PyObject *self, PyObject *args)
{
    (void)self;
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
    Py_XSETREF(T_SYMBOL, (PyTypeObject *)symbol);
    Py_XSETREF(T_KEYWORD, (PyTypeObject *)keyword);
    Py_XSETREF(T_URI, (PyTypeObject *)uri);
    Py_XSETREF(T_DECIMAL, (PyTypeObject *)decimal);
    C_LPAR = lpar;
    C_RPAR = rpar;
    C_INTEGER = integer;
    C_DECIMAL = dec;
    C_SYMBOL = sym;
    C_KEYWORD = kw;
    C_URI = u;
    C_FIRST = first;
    MAX_DECIMAL_CHARS = max_decimal;
    Py_RETURN_NONE;
}

static PyMethodDef methods[] = {
    {"canonical", canonical, METH_O,
     "canonical(value, /) -> str | None: the canonical text of a value, or None to decline."},
    {"pack_frame", (PyCFunction)(void (*)(void))pack_frame, METH_FASTCALL,
     "pack_frame(header, tokens, body, table, /) -> bytes | None: a binary frame, or None "
     "to decline (table: what prepare(codes) returned)."},
    {"prepare", prepare, METH_O,
     "prepare(codes, /) -> object | None: a symbol table's codes as pack_frame takes them."},
    {"setup", setup, METH_VARARGS,
     "setup(Symbol, Keyword, URI, Decimal, max_decimal_chars, codes, /): the types and "
     "constants of cbcl._values and cbcl._vocabulary."},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {
    PyModuleDef_HEAD_INIT, "cbcl._encoders",
    "Optional C twins of the canonical text writer and the binary frame writer.", -1,
    methods, NULL, NULL, NULL, NULL,
};

PyMODINIT_FUNC
PyInit__encoders(void)
{
    for (int c = 0; c < 0x20; c++)
        ESCAPE1[c] = 1;
    for (int c = 0x7f; c <= 0x9f; c++)
        ESCAPE1[c] = 1;
    ESCAPE1['"'] = ESCAPE1['\\'] = ESCAPE1['\n'] = ESCAPE1['\r'] = ESCAPE1['\t'] = 2;
    return PyModule_Create(&module);
}
