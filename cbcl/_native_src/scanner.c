/* Optional C twin of the text reader (cbcl/core/_reader.py).
 *
 * Theory of operation
 * -------------------
 * One function, read_value(text, pos, cache, make_atom, depth_left, max_items, budget,
 * max_string, max_name[, utf8]) -> (value, end, nodes) | None, the twin of cbcl.core._reader's
 * read_value_python (the reference, and the fallback): it reads the one value that
 * starts at character `pos` of `text` (whitespace and comments may precede it) and returns
 * it with the character index just after it and the number of nodes it holds.
 *
 * It serves only the happy path and never raises for anything in its input: on any doubt
 * (a character no token may hold, a string that is not closed or holds a forbidden
 * character or an invalid escape, an atom the atom rules refuse, a limit: depth, items,
 * nodes, string bytes, name characters) it returns None, and the Python reference read the same
 * text again, to return the same value or raise the precise error. Exceptions come only
 * from the interpreter (MemoryError) or from make_atom.
 *
 * The scan is over the text's UTF-8 (the str's own bytes when it is ASCII, else `utf8`,
 * the bytes it was decoded from, when the caller has them, else the UTF-8 the str
 * caches), so it is one byte loop whatever the str's kind; indexes are converted
 * to characters only at the end, for a text that is not ASCII, which is read from its
 * start only (a later `pos` is left to the Python reference, so that reading value after
 * value stays linear). Whitespace is CBCL's four
 * characters; a comment runs from ';' to the first character a comment refuses (the line
 * end among them), as cbcl.core._reader.TOKEN skips one. An atom is the run of characters up to
 * a delimiter (whitespace, '(', ')', ';' or the end); a run that meets '"' is an error.
 * Strings are checked and unescaped here, byte by byte, their UTF-8 size measured exactly
 * (so a long string or an escape is read in place, never a reason to decline). Integers
 * are read here, range-checked against int64. Every other atom's run is looked up in
 * `cache`, the reader's token cache (token text -> atom, every entry valid). A miss on an
 * ASCII keyword, symbol or URI (new names: agents invent them all the time, and a peer can
 * choose to) is judged and made here (new_name_atom: C mirrors of the NAME, SYMBOL and
 * URI rules of cbcl.core._vocabulary), the name interned in the reader's own intern tables
 * (intern.c's NameTables, probed with the run's bytes, their bound kept; a new atom
 * written in place from those bytes, atom_write: no token str) and a
 * URI made (a symbol's and a keyword's intern table is its cache: looked up first for a
 * run that is a NAME or ':' and a NAME, by the name, and a new one goes there only; an
 * ASCII URI is made at once, the memo its only cache); every other miss calls
 * `make_atom(token,
 * max_name)` (cbcl.core._reader._atom: the atom rules as regular expressions, which makes
 * the atom, remembers it, or returns None). Python's rules stay the definition: the C
 * mirrors are held to them by tests/test_scanner.py, tests/test_intern_native.py and
 * tests/fuzz/fuzz_scanner.py. The cyclic collector is paused while a value is read (see
 * cbcl_read_value_of); when an intern table is emptied, so are the memos (cbcl_forget_memos).
 */
#include "cstack.h"
#include "intern.h"

static int
is_space(unsigned char c)
{
    return c == ' ' || c == '\t' || c == '\r' || c == '\n';
}

/* Where an atom ends: whitespace, '(', ')' and ';' ('"' is an error, and the end): 1 for
 * those bytes (a table: the run of every atom is scanned with it). And NUL, which stands
 * after the last byte of every text read (a str's data, a bytes object's and the UTF-8 a
 * str caches are NUL-terminated), so the scan needs no test of the length: a NUL before
 * the end stops it too, and is then declined as the byte no atom holds. */
static const unsigned char ends_atom[256] = {
    [0] = 1, ['\t'] = 1, ['\n'] = 1, ['\r'] = 1, [' '] = 1, ['('] = 1, [')'] = 1,
    [';'] = 1, ['"'] = 1,
};

/* The code point of the multi-byte sequence at p[i] (p[i] >= 0x80) of valid UTF-8, and its
 * size in *size; *size is 0 for a sequence that is not well formed or runs past n. */
static Py_UCS4
utf8_at(const unsigned char *p, Py_ssize_t i, Py_ssize_t n, int *size)
{
    unsigned char c = p[i];
    int k;
    Py_UCS4 u;
    if (c >= 0xf0 && c <= 0xf4) {
        k = 4;
        u = c & 0x07;
    } else if (c >= 0xe0) {
        k = c <= 0xef ? 3 : 0;
        u = c & 0x0f;
    } else if (c >= 0xc2) {
        k = 2;
        u = c & 0x1f;
    } else {
        k = 0;
        u = 0;
    }
    if (k == 0 || i + k > n) {
        *size = 0;
        return 0;
    }
    for (int j = 1; j < k; j++) {
        unsigned char t = p[i + j];
        if ((t & 0xc0) != 0x80) {
            *size = 0;
            return 0;
        }
        u = (u << 6) | (t & 0x3f);
    }
    *size = k;
    return u;
}

/* Characters refused unescaped in strings beyond ASCII: C1 controls and the bidirectional
 * embedding/override/isolate controls (cbcl.core._reader._FORBIDDEN). */
static int
string_refuses(Py_UCS4 u)
{
    return (u >= 0x80 && u <= 0x9f) || (u >= 0x202a && u <= 0x202e) ||
           (u >= 0x2066 && u <= 0x2069);
}

/* What stops a comment beyond ASCII (cbcl.core._reader._COMMENT_PATTERN): the string's and the
 * line and paragraph separators and the byte-order mark. */
static int
comment_refuses(Py_UCS4 u)
{
    return string_refuses(u) || u == 0x2028 || u == 0x2029 || u == 0xfeff;
}

/* The index of the first byte from i on that is no whitespace nor part of a comment. */
static Py_ssize_t
skip_blank(const unsigned char *p, Py_ssize_t i, Py_ssize_t n)
{
    for (;;) {
        while (i < n && is_space(p[i]))
            i++;
        if (i >= n || p[i] != ';')
            return i;
        for (i++; i < n;) {
            unsigned char c = p[i];
            if (c < 0x80) {
                if (c <= 0x08 || (c >= 0x0a && c <= 0x1f) || c == 0x7f)
                    break;
                i++;
            } else {
                int size;
                Py_UCS4 u = utf8_at(p, i, n, &size);
                if (size == 0 || comment_refuses(u))
                    break;
                i += size;
            }
        }
    }
}

static int
hex_value(unsigned char c)
{
    if (c >= '0' && c <= '9')
        return c - '0';
    if (c >= 'a' && c <= 'f')
        return c - 'a' + 10;
    if (c >= 'A' && c <= 'F')
        return c - 'A' + 10;
    return -1;
}

/* 1 for the bytes a string holds as they are, with nothing to check: printable ASCII but
 * '"' and '\\' (bytes from 0x80 on: 0). */
static const unsigned char string_plain[256] = {
    0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0,
    0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0,
    1, 1, 0, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1,
    1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1,
    1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1,
    1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 0, 1, 1, 1,
    1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1,
    1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 0,
};

/* The string whose opening quote is p[i]: a new reference, Py_None if it is not a valid
 * string within max_string bytes followed by a delimiter, NULL with an exception. *end
 * receives the index after the closing quote. */
static PyObject *
read_string(const unsigned char *p, Py_ssize_t i, Py_ssize_t n, Py_ssize_t max_string,
            Py_ssize_t *end)
{
    Py_ssize_t j = i + 1, size = 0;
    int escapes = 0, wide = 0; /* wide: a byte from 0x80 on (else the string is ASCII) */
    for (;;) {
        Py_ssize_t run = j; /* the plain ASCII from here: one table look-up a byte */
        while (j < n && string_plain[p[j]])
            j++;
        size += j - run;
        if (size > max_string)
            Py_RETURN_NONE;
        if (j >= n)
            Py_RETURN_NONE; /* not closed */
        unsigned char c = p[j];
        if (c == '"')
            break;
        if (c == '\\') {
            if (j + 1 >= n)
                Py_RETURN_NONE;
            unsigned char e = p[j + 1];
            if (e == '"' || e == '\\' || e == 'n' || e == 'r' || e == 't') {
                size += 1;
                j += 2;
            } else if (e == 'u') {
                int h[4];
                if (j + 6 > n)
                    Py_RETURN_NONE;
                for (int k = 0; k < 4; k++)
                    if ((h[k] = hex_value(p[j + 2 + k])) < 0)
                        Py_RETURN_NONE;
                Py_UCS4 u = (Py_UCS4)((h[0] << 12) | (h[1] << 8) | (h[2] << 4) | h[3]);
                if (u >= 0xd800 && u <= 0xdfff)
                    Py_RETURN_NONE; /* a surrogate */
                size += u < 0x80 ? 1 : u < 0x800 ? 2 : 3;
                j += 6;
            } else {
                Py_RETURN_NONE;
            }
            escapes = 1;
        } else if (c < 0x80) {
            if (c < 0x20 || c == 0x7f)
                Py_RETURN_NONE;
            size += 1;
            j += 1;
        } else {
            int k;
            Py_UCS4 u = utf8_at(p, j, n, &k);
            if (k == 0 || string_refuses(u))
                Py_RETURN_NONE;
            size += k;
            j += k;
            wide = 1;
        }
        if (size > max_string)
            Py_RETURN_NONE;
    }
    /* p[j] is the closing quote: a delimiter or the end must follow it. */
    if (j + 1 < n && !(is_space(p[j + 1]) || p[j + 1] == '(' || p[j + 1] == ')' ||
                       p[j + 1] == ';'))
        Py_RETURN_NONE;
    *end = j + 1;
    if (!escapes && !wide) { /* ASCII, checked above: copied, not decoded */
        PyObject *ascii = PyUnicode_New(j - i - 1, 127);
        if (ascii != NULL)
            memcpy(PyUnicode_DATA(ascii), p + i + 1, (size_t)(j - i - 1));
        return ascii;
    }
    if (!escapes)
        return PyUnicode_DecodeUTF8((const char *)p + i + 1, j - i - 1, "strict");
    char *out = PyMem_Malloc(size > 0 ? (size_t)size : 1);
    if (out == NULL)
        return PyErr_NoMemory();
    Py_ssize_t o = 0;
    for (Py_ssize_t k = i + 1; k < j;) {
        unsigned char c = p[k];
        if (c != '\\') {
            out[o++] = (char)c;
            k++;
            continue;
        }
        unsigned char e = p[k + 1];
        if (e == 'u') {
            Py_UCS4 u = (Py_UCS4)((hex_value(p[k + 2]) << 12) | (hex_value(p[k + 3]) << 8) |
                                  (hex_value(p[k + 4]) << 4) | hex_value(p[k + 5]));
            if (u < 0x80) {
                out[o++] = (char)u;
            } else if (u < 0x800) {
                out[o++] = (char)(0xc0 | (u >> 6));
                out[o++] = (char)(0x80 | (u & 0x3f));
            } else {
                out[o++] = (char)(0xe0 | (u >> 12));
                out[o++] = (char)(0x80 | ((u >> 6) & 0x3f));
                out[o++] = (char)(0x80 | (u & 0x3f));
            }
            k += 6;
            continue;
        }
        out[o++] = e == 'n' ? '\n' : e == 'r' ? '\r' : e == 't' ? '\t' : (char)e;
        k += 2;
    }
    PyObject *value = PyUnicode_DecodeUTF8(out, o, "strict");
    PyMem_Free(out);
    return value;
}

/* The int the run p[i:k] spells if it is an integer token (-?(0|[1-9][0-9]*), not "-0")
 * within int64: a new reference; Py_None if it is not written as one; NULL with an
 * exception. *kind receives 1 for an integer token (valid or out of range: then None is
 * returned too, and the caller declines), 0 for a run that is not an integer token. */
static PyObject *
read_integer(const unsigned char *p, Py_ssize_t i, Py_ssize_t k, int *kind)
{
    int negative = p[i] == '-';
    Py_ssize_t d = i + negative;
    *kind = 0;
    if (d >= k || p[d] < '0' || p[d] > '9')
        Py_RETURN_NONE;
    if (p[d] == '0' && (k - d != 1 || negative))
        Py_RETURN_NONE; /* a decimal, "-0", or a leading zero: not an integer token */
    unsigned long long magnitude = 0;
    for (Py_ssize_t j = d; j < k; j++) {
        unsigned char c = p[j];
        if (c < '0' || c > '9')
            Py_RETURN_NONE; /* a decimal, or no atom */
        if (magnitude > (ULLONG_MAX - 9) / 10) {
            magnitude = ULLONG_MAX; /* over int64 (and saturated) */
            for (j++; j < k; j++)
                if (p[j] < '0' || p[j] > '9')
                    Py_RETURN_NONE;
            break;
        }
        magnitude = magnitude * 10 + (c - '0');
    }
    *kind = 1;
    if (negative) {
        if (magnitude > (unsigned long long)LLONG_MAX + 1)
            Py_RETURN_NONE;
        if (magnitude == (unsigned long long)LLONG_MAX + 1)
            return PyLong_FromLongLong(LLONG_MIN);
        return PyLong_FromLongLong(-(long long)magnitude);
    }
    if (magnitude > (unsigned long long)LLONG_MAX)
        Py_RETURN_NONE;
    return PyLong_FromLongLong((long long)magnitude);
}

#define CACHED_DECIMAL_CHARS 4 /* cbcl.core._reader._atom caches the decimals of at most 4 */


/* Whether the run p[i:k] of k - i > max_name characters may be an atom within the name
 * limit: a keyword of exactly max_name characters after its colon, or a URI (a run that
 * holds "://" and is no keyword: a keyword's name may hold "://" too), as
 * cbcl.core._reader._atom rules for cached names. */
static int
long_run_allowed(const unsigned char *p, Py_ssize_t i, Py_ssize_t k, Py_ssize_t chars,
                 Py_ssize_t max_name)
{
    if (p[i] == ':')
        return chars == max_name + 1;
    for (Py_ssize_t j = i; j + 2 < k; j++)
        if (p[j] == ':' && p[j + 1] == '/' && p[j + 2] == '/')
            return 1;
    return 0;
}

/* The number of characters of the UTF-8 p[i:k]. */
static Py_ssize_t
chars_of(const unsigned char *p, Py_ssize_t i, Py_ssize_t k)
{
    Py_ssize_t count = 0;
    for (; i < k; i++)
        count += (p[i] & 0xc0) != 0x80;
    return count;
}

/* ---------------------------------------------------------------- new names, in C
 *
 * The reader's rules for names (cbcl.core._vocabulary): NAME_START [A-Za-z+-*\/<>=!?_.],
 * NAME_REST adds [0-9@%&]; a SYMBOL is a NAME that does not start like a number
 * (NUMBERLIKE: [+-]?\.?[0-9]); a keyword is ':' NAME; a URI is [a-z][a-z0-9+.-]* "://"
 * and at least one character URI_REST_EXCLUDES does not hold (here: ASCII only, so every
 * byte above space but DEL, '(', ')', '"' and ';'; a run holding other bytes is left to
 * make_atom). */
#define NAME_START 1
#define NAME_REST 2

/* Each byte's NAME_START and NAME_REST bits (bytes from 0x80 on: none). */
static const unsigned char name_classes[256] = {
    0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0,
    0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0,
    0, 3, 0, 0, 0, 2, 2, 0, 0, 0, 3, 3, 0, 3, 3, 3,
    2, 2, 2, 2, 2, 2, 2, 2, 2, 2, 0, 0, 3, 3, 3, 3,
    2, 3, 3, 3, 3, 3, 3, 3, 3, 3, 3, 3, 3, 3, 3, 3,
    3, 3, 3, 3, 3, 3, 3, 3, 3, 3, 3, 0, 0, 0, 0, 3,
    0, 3, 3, 3, 3, 3, 3, 3, 3, 3, 3, 3, 3, 3, 3, 3,
    3, 3, 3, 3, 3, 3, 3, 3, 3, 3, 3, 0, 0, 0, 0, 0,
};

static int
name_start(unsigned char c)
{
    return name_classes[c] & NAME_START;
}

/* Whether p[i:k] (k > i) is a NAME. */
static int
is_name(const unsigned char *p, Py_ssize_t i, Py_ssize_t k)
{
    if (!name_start(p[i]))
        return 0;
    unsigned char all = NAME_REST;
    for (Py_ssize_t j = i + 1; j < k; j++)
        all &= name_classes[p[j]];
    return all != 0;
}

/* Whether p[i:k] starts like a number (NUMBERLIKE). */
static int
numberlike(const unsigned char *p, Py_ssize_t i, Py_ssize_t k)
{
    if (i < k && (p[i] == '+' || p[i] == '-'))
        i++;
    if (i < k && p[i] == '.')
        i++;
    return i < k && p[i] >= '0' && p[i] <= '9';
}

/* Whether the ASCII p[0:n] is a keyword's name (a NAME) or, where `symbol`, a symbol's
 * (a NAME not NUMBERLIKE): the reader's rule, for the binary decoder's names written in
 * full (speedups.c), judged before any str is made of them. */
CBCL_INTERNAL int
cbcl_ascii_name(const unsigned char *p, Py_ssize_t n, int symbol)
{
    return n > 0 && is_name(p, 0, n) && !(symbol && numberlike(p, 0, n));
}

/* Whether the ASCII p[i:k] is a URI. */
static int
is_ascii_uri(const unsigned char *p, Py_ssize_t i, Py_ssize_t k)
{
    if (i >= k || p[i] < 'a' || p[i] > 'z')
        return 0;
    Py_ssize_t j = i + 1;
    while (j < k && ((p[j] >= 'a' && p[j] <= 'z') || (p[j] >= '0' && p[j] <= '9') ||
                     p[j] == '+' || p[j] == '.' || p[j] == '-'))
        j++;
    if (k - j < 4 || p[j] != ':' || p[j + 1] != '/' || p[j + 2] != '/')
        return 0;
    for (j += 3; j < k; j++)
        if (p[j] <= 0x20 || p[j] >= 0x7f || p[j] == '(' || p[j] == ')' || p[j] == '"' ||
            p[j] == ';')
            return 0;
    return 1;
}

/* ---------------------------------------------------------------- atoms written in place
 *
 * A Symbol, Keyword or URI is a str subclass with no __dict__ (__slots__ = ()).
 * str.__new__(type, text) (CPython's unicode_subtype_new) costs some 400 instructions for
 * a short name, most of them not the object's: a tuple of arguments, their parsing,
 * PyObject_Str, zeroing the object and tracking it with the collector (the readers untrack
 * it at once). The object it writes is a PyUnicodeObject that is not compact: the fields
 * of cpython/unicodeobject.h, and a pointer to the characters in a buffer of their own
 * (for ASCII, the UTF-8 pointer shares it). atom_in_place writes that same object for an
 * exact ASCII str: allocated by PyObject_GC_New (untracked), its fields zeroed, then
 * length, hash (the text's), kind, ascii (and, before 3.12, ready), the buffer and the
 * UTF-8 pointer and length set as unicode_subtype_new sets them; it is freed by the
 * type's own dealloc as str.__new__'s are. A name short enough to fit in that object past
 * a compact ASCII header (COMPACT_ROOM) is written instead as a compact ASCII str is, its
 * characters inside the object: one allocation, not two (issue 35: a new name's cost is
 * its memory more than its instructions). That layout is CPython's, not a public API, so
 * check_atoms_in_place (at exec, in each module object) requires that each type adds
 * nothing to str's layout and that atoms made here of sample texts match the ones
 * str.__new__ makes, field by field; where it does not hold (or the build is not one this
 * was written for), every atom is made by str.__new__ (a compact atom is checked against the
 * exact str of its text and str.__new__'s atom: its reads, hash and equality). */
#if PY_VERSION_HEX >= 0x030B0000 && PY_VERSION_HEX < 0x030E0000 && !defined(Py_GIL_DISABLED)
#define CBCL_ATOMS_IN_PLACE 1
#else
#define CBCL_ATOMS_IN_PLACE 0
#endif

#if CBCL_ATOMS_IN_PLACE
/* The room an atom's object has for its characters when it is written compact: the type's
 * size (str's non-compact PyUnicodeObject) past a compact ASCII header (PyASCIIObject),
 * where a compact ASCII str keeps its characters and their NUL. */
#define COMPACT_ROOM ((Py_ssize_t)(sizeof(PyUnicodeObject) - sizeof(PyASCIIObject)))

static PyObject *
atom_write(PyTypeObject *type, const char *chars, Py_ssize_t n, Py_hash_t hash)
{
    if (n < COMPACT_ROOM) {
        /* A name that fits (most: 31 characters on 3.11, 23 from 3.12) is written as a
         * compact ASCII str, its characters inside the object after the header, as
         * PyUnicode_New writes an exact one: one allocation per atom, not two, and one
         * block to touch. unicode_dealloc frees no buffer for a compact str, and tp_free
         * (PyObject_GC_Del) frees the block. */
        PyASCIIObject *a = (PyASCIIObject *)PyObject_GC_New(PyUnicodeObject, type);
        if (a == NULL)
            return NULL;
        memset((char *)a + sizeof(PyObject), 0, sizeof(PyASCIIObject) - sizeof(PyObject));
        a->length = n;
        a->hash = hash;
        a->state.kind = PyUnicode_1BYTE_KIND;
        a->state.compact = 1;
        a->state.ascii = 1;
#if PY_VERSION_HEX < 0x030C0000
        a->state.ready = 1;
#endif
        memcpy(a + 1, chars, (size_t)n);
        ((char *)(a + 1))[n] = '\0';
        return (PyObject *)a;
    }
    char *data = PyObject_Malloc((size_t)n + 1);
    if (data == NULL)
        return PyErr_NoMemory();
    PyUnicodeObject *u = PyObject_GC_New(PyUnicodeObject, type);
    if (u == NULL) {
        PyObject_Free(data);
        return NULL;
    }
    memset((char *)u + sizeof(PyObject), 0, sizeof(PyUnicodeObject) - sizeof(PyObject));
    memcpy(data, chars, (size_t)n);
    data[n] = '\0';
    PyASCIIObject *a = (PyASCIIObject *)u;
    a->length = n;
    a->hash = hash;
    a->state.kind = PyUnicode_1BYTE_KIND;
    a->state.ascii = 1;
#if PY_VERSION_HEX < 0x030C0000
    a->state.ready = 1;
#endif
    ((PyCompactUnicodeObject *)u)->utf8 = data;
    ((PyCompactUnicodeObject *)u)->utf8_length = n;
    u->data.any = data;
    return (PyObject *)u;
}

/* The atom of the exact ASCII str `text`, written in place (its hash: the text's). */
static PyObject *
atom_in_place(PyTypeObject *type, PyObject *text)
{
    Py_hash_t hash = PyObject_Hash(text); /* (a str's: cached, and never fails) */
    return atom_write(type, PyUnicode_DATA(text), PyUnicode_GET_LENGTH(text), hash);
}

/* Whether `mine` (made by atom_in_place) and `theirs` (by str.__new__) are the same
 * object but for their address and the collector's view. */
static int
same_fields(PyObject *mine, PyObject *theirs)
{
    PyASCIIObject *a = (PyASCIIObject *)mine, *b = (PyASCIIObject *)theirs;
    PyCompactUnicodeObject *ca = (PyCompactUnicodeObject *)mine,
                           *cb = (PyCompactUnicodeObject *)theirs;
    if (a->state.compact) { /* (a short name: written as a compact str, not as theirs) */
        Py_ssize_t size = -1;
        const char *utf8 = PyUnicode_AsUTF8AndSize(mine, &size);
        return Py_TYPE(mine) == Py_TYPE(theirs) && a->length < COMPACT_ROOM &&
               PyObject_Hash(mine) == PyObject_Hash(theirs) && a->length == b->length &&
               a->hash == b->hash && a->state.interned == 0 && a->state.ascii &&
               a->state.kind == b->state.kind && PyUnicode_IS_COMPACT_ASCII(mine) &&
               utf8 == (const char *)(a + 1) && size == a->length &&
               PyUnicode_DATA(mine) == (void *)(a + 1) &&
               memcmp(PyUnicode_DATA(mine), PyUnicode_DATA(theirs),
                      (size_t)a->length + 1) == 0 &&
               PyUnicode_Compare(mine, theirs) == 0 && !PyErr_Occurred();
    }
    if (Py_TYPE(mine) != Py_TYPE(theirs) || PyObject_Hash(mine) != PyObject_Hash(theirs) ||
            a->length != b->length || a->hash != b->hash ||
            a->state.interned != b->state.interned || a->state.kind != b->state.kind ||
            a->state.compact != b->state.compact || a->state.ascii != b->state.ascii ||
            ca->utf8_length != cb->utf8_length || ca->utf8 != ((PyUnicodeObject *)mine)->data.any ||
            cb->utf8 != ((PyUnicodeObject *)theirs)->data.any)
        return 0;
#if PY_VERSION_HEX < 0x030C0000
    if (a->state.ready != b->state.ready || a->wstr != b->wstr ||
            ca->wstr_length != cb->wstr_length)
        return 0;
#endif
    return memcmp(PyUnicode_DATA(mine), PyUnicode_DATA(theirs), (size_t)a->length + 1) == 0 &&
           PyUnicode_Compare(mine, theirs) == 0 && !PyErr_Occurred();
}
#endif

/* Whether atom_in_place may make the atoms of vt's types (see above): 1, 0, or -1 with an
 * exception. */
static int
check_atoms_in_place(const ValueTypes *vt)
{
#if CBCL_ATOMS_IN_PLACE
    static const char *const samples[] = {
        "a", "agent://x.example.net/role", "purchase-order-7", "",
        "agent://warehouse.example.net/dispatch/orders/7"}; /* (the last: not compact) */
    for (int k = 0; k < 3; k++) {
        PyTypeObject *type = vt->inert[k];
        if (!PyType_IsSubtype(type, &PyUnicode_Type) ||
                type->tp_basicsize != PyUnicode_Type.tp_basicsize || type->tp_itemsize != 0 ||
                type->tp_dictoffset != 0 || type->tp_weaklistoffset != 0 ||
                !PyType_HasFeature(type, Py_TPFLAGS_HAVE_GC) ||
                type->tp_free != PyObject_GC_Del)
            return 0;
        for (size_t j = 0; j < sizeof samples / sizeof *samples; j++) {
            PyObject *text = PyUnicode_FromString(samples[j]);
            if (text == NULL)
                return -1;
            PyObject *args = PyTuple_Pack(1, text);
            PyObject *theirs = args ? PyUnicode_Type.tp_new(type, args, NULL) : NULL;
            Py_XDECREF(args);
            PyObject *mine = theirs ? atom_in_place(type, text) : NULL;
            int same = mine != NULL && same_fields(mine, theirs);
            Py_DECREF(text);
            Py_XDECREF(theirs);
            Py_XDECREF(mine);
            if (PyErr_Occurred())
                return -1;
            if (!same)
                return 0;
        }
    }
    return 1;
#else
    (void)vt;
    return 0;
#endif
}

PyObject *
cbcl_new_atom(const ValueTypes *vt, int which, PyObject *text)
{
#if CBCL_ATOMS_IN_PLACE
    if (vt->atoms_in_place && PyUnicode_IS_ASCII(text))
        return atom_in_place(vt->inert[which], text);
#endif
    PyObject *args = PyTuple_Pack(1, text);
    if (args == NULL)
        return NULL;
    PyObject *value = PyUnicode_Type.tp_new(vt->inert[which], args, NULL);
    Py_DECREF(args);
    /* An atom refers to its type only: in no cycle, so never worth a collector's walk (as
     * CPython untracks a tuple of atoms). Reading a body of new names then sets off no
     * collection that walks them. */
    if (value != NULL && PyObject_GC_IsTracked(value))
        PyObject_GC_UnTrack(value);
    return value;
}

PyObject *
cbcl_new_atom_ascii(const ValueTypes *vt, int which, const char *p, Py_ssize_t n,
                    Py_hash_t hash)
{
#if CBCL_ATOMS_IN_PLACE
    if (vt->atoms_in_place)
        return atom_write(vt->inert[which], p, n, hash);
#endif
    PyObject *text = PyUnicode_FromStringAndSize(p, n);
    if (text == NULL)
        return NULL;
    PyObject *atom = cbcl_new_atom(vt, which, text);
    Py_DECREF(text);
    return atom;
}

/* Forget every atom the native memos hold (the scanner's token memo, the decoder's atom
 * memo, the reader's token cache): called when an intern table is emptied, so that no memo
 * gives a name's atom from before, equal to the one the table holds from now on but not
 * the same object. */
void
cbcl_forget_memos(NativeState *st)
{
    for (int k = 0; k < CBCL_MEMO_SLOTS; k++) {
        Py_CLEAR(st->scanner.memo[k].key);
        Py_CLEAR(st->scanner.memo[k].value);
        Py_CLEAR(st->speedups.atom_memo[k].key);
        Py_CLEAR(st->speedups.atom_memo[k].value);
    }
    if (st->scanner.intern.cache != NULL)
        PyDict_Clear(st->scanner.intern.cache);
}

PyObject *
cbcl_intern_name(NativeState *st, int keyword, PyObject *name)
{
    InternTables *t = &st->scanner.intern;
    if (t->symbols == NULL)
        Py_RETURN_NONE;
    return cbcl_names_intern(st, (NameTable *)(keyword ? t->keywords : t->symbols), name);
}

/* (The tables are intern.c's NameTables, which no caller looks in but through these: a
 * caller's "not found" was in some other cache, so the table is looked in here too.) */
PyObject *
cbcl_intern_new_name(NativeState *st, int keyword, PyObject *name)
{
    return cbcl_intern_name(st, keyword, name);
}

/* The atom of the ASCII run p[i:k] (the str `token`) if it is a keyword, a symbol or a
 * URI, made here and remembered in `cache` as cbcl.core._reader._atom does: 1 with *out
 * (a new reference); 0 to leave it to make_atom (another atom, an error, or the intern
 * tables not set up); -1 with an exception. The caller has checked the name limit. */
static int
new_name_atom(NativeState *st, const unsigned char *p, Py_ssize_t i, Py_ssize_t k,
              PyObject *token, PyObject *cache, PyObject **out)
{
    InternTables *t = &st->scanner.intern;
    PyObject *value;
    if (t->symbols == NULL)
        return 0;
    if (p[i] == ':') {
        if (k - i < 2 || !is_name(p, i + 1, k))
            return 0;
        value = cbcl_names_intern_ascii(st, (NameTable *)t->keywords,
                                        (const char *)p + i + 1, k - i - 1);
    } else if (is_name(p, i, k)) {
        if (numberlike(p, i, k))
            return 0;
        value = cbcl_names_intern_ascii(st, (NameTable *)t->symbols, (const char *)p + i,
                                        k - i);
    } else if (is_ascii_uri(p, i, k)) {
        value = cbcl_new_atom(&st->values, 2, token); /* _new(URI, …) */
    } else {
        return 0;
    }
    if (value == NULL)
        return -1;
    if (k - i <= t->cache_chars) {
        if (PyDict_GET_SIZE(cache) >= t->cache_max)
            PyDict_Clear(cache);
        if (PyDict_SetItem(cache, token, value) < 0) {
            Py_DECREF(value);
            return -1;
        }
    }
    *out = value;
    return 1;
}

/* setup_intern(symbols, keywords, cache_chars, cache_max[, cache]) -> None: the reader's
 * intern tables (cbcl.core._values' SYMBOL_TABLE and KEYWORD_TABLE, intern.c's NameTables,
 * which keep their own bound and pinned names) and the bounds of its token cache, kept in
 * the module's state for cbcl_intern_name and the reader's new names; `cache`, the reader's
 * token cache, is emptied with the memos when a table is. */
static PyObject *
setup_intern(PyObject *module, PyObject *args)
{
    NativeState *st = native_state(module);
    if (st == NULL)
        return NULL;
    PyObject *symbols, *keywords, *cache = NULL;
    Py_ssize_t cache_chars, cache_max;
    if (!PyArg_ParseTuple(args, "OOnn|O!", &symbols, &keywords, &cache_chars, &cache_max,
                          &PyDict_Type, &cache))
        return NULL;
    if (!cbcl_is_name_table(symbols) || !cbcl_is_name_table(keywords) ||
            ((NameTable *)symbols)->which != 0 || ((NameTable *)keywords)->which != 1) {
        PyErr_SetString(PyExc_TypeError,
                        "setup_intern: symbols and keywords must be NameTables of their kind");
        return NULL;
    }
    if (cache_chars < 0 || cache_max < 1) {
        PyErr_SetString(PyExc_ValueError, "setup_intern: the bounds must be positive");
        return NULL;
    }
    InternTables *t = &st->scanner.intern;
    Py_XSETREF(t->symbols, Py_NewRef(symbols));
    Py_XSETREF(t->keywords, Py_NewRef(keywords));
    Py_XSETREF(t->cache, Py_XNewRef(cache));
    t->cache_chars = cache_chars;
    t->cache_max = cache_max;
    Py_RETURN_NONE;
}

/* forget_atoms() -> None: what an intern table's emptying in Python calls
 * (cbcl.core._reader._intern), as cbcl_intern_name's does: the native memos forgotten. */
static PyObject *
forget_atoms(PyObject *module, PyObject *Py_UNUSED(ignored))
{
    NativeState *st = native_state(module);
    if (st == NULL)
        return NULL;
    cbcl_forget_memos(st);
    Py_RETURN_NONE;
}

/* The scanner's own memo of atoms by their token's bytes, in front of `cache`
 * (MemoSlot, native.h; st->scanner.memo, in the module's state): direct-mapped,
 * MEMO_SLOTS slots of ASCII tokens of at most MEMO_CHARS characters, each holding the
 * token and the atom `cache` or make_atom gave for it. A pure memo, as `cache` is
 * (spec/cbcl-1.0.md, "Process-wide memos"): the atom a token denotes does not depend on
 * when it was read, and no limit is stored (the name limit is checked before the
 * lookup). */
#define MEMO_SLOTS CBCL_MEMO_SLOTS
#define MEMO_CHARS 64

/* The atom of the run p[i:k] (`ascii`: whether the run is): a new reference, Py_None to
 * decline, NULL with an exception. */
static PyObject *
read_atom(NativeState *st, const unsigned char *p, Py_ssize_t i, Py_ssize_t k, int ascii,
          size_t hash, PyObject *cache, PyObject *make_atom, Py_ssize_t max_name,
          int gc_paused)
{
    if ((p[i] >= '0' && p[i] <= '9') || p[i] == '-') {
        int integer;
        PyObject *number = read_integer(p, i, k, &integer);
        if (number != Py_None || integer)
            return number;
        Py_DECREF(number);
        if (k - i > CACHED_DECIMAL_CHARS && is_decimal(p, i, k)) { /* never cached */
            if (k - i > MAX_DECIMAL_CHARS)
                Py_RETURN_NONE;
            return decimal_of(&st->values, p + i, k - i, NULL);
        }
    }
    int numeric = (p[i] >= '0' && p[i] <= '9') ||
                  (p[i] == '-' && i + 1 < k && p[i + 1] >= '0' && p[i + 1] <= '9');
    Py_ssize_t chars = ascii ? k - i : chars_of(p, i, k);
    if (!numeric && chars > max_name && !long_run_allowed(p, i, k, chars, max_name))
        Py_RETURN_NONE; /* a name over the limit (a number's run has none) */
    Py_ssize_t length = k - i;
    MemoSlot *slot = NULL;
    if (ascii && p[i] == ':' && length >= 2 && st->scanner.intern.symbols != NULL) {
        /* A keyword: its intern table is its cache, as a symbol's is, probed with the
         * name's bytes (no str made for it, no token-cache entry), and its memo slot
         * keyed by the name (kind 1: no symbol's entry matches it, and only a keyword's
         * name is kept under it, so a hit needs no NAME check). */
        if (length <= MEMO_CHARS) {
            slot = &st->scanner.memo[hash & (MEMO_SLOTS - 1)];
            PyObject *hit = memo_hit(slot, 1, p + i + 1, length - 1);
            if (hit != NULL)
                return hit;
        }
        if (!is_name(p, i + 1, k))
            goto not_a_keyword;
        /* (no str is made for the name: the table is probed with its bytes, and a new
         * keyword written from them; the memo keyed by the atom, whose text is the name) */
        PyObject *value = cbcl_names_intern_ascii(st, (NameTable *)st->scanner.intern.keywords,
                                                  (const char *)p + i + 1, length - 1);
        if (slot != NULL && value != NULL)
            memo_keep(slot, 1, value, value);
        return value;
    }
not_a_keyword:
    slot = NULL;
    if (length <= MEMO_CHARS && (ascii || chars == length)) {
        slot = &st->scanner.memo[hash & (MEMO_SLOTS - 1)];
        PyObject *hit = memo_hit(slot, 0, p + i, length);
        if (hit != NULL)
            return hit;
    }
    if (ascii && st->scanner.intern.symbols != NULL && is_name(p, i, k) &&
            !numberlike(p, i, k)) {
        /* A symbol: its intern table is its cache (not the token cache too: one entry,
         * and the cache keeps its room for the atoms only it holds), probed with the
         * run's bytes; a new one written from them (no token str), the memo keyed by the
         * atom, whose text is the token. */
        PyObject *value = cbcl_names_intern_ascii(st, (NameTable *)st->scanner.intern.symbols,
                                                  (const char *)p + i, length);
        if (slot != NULL && value != NULL)
            memo_keep(slot, 0, value, value);
        return value;
    }
    PyObject *token;
    if (ascii) { /* (known ASCII: copied, not decoded) */
        token = PyUnicode_New(length, 127);
        if (token == NULL)
            return NULL;
        memcpy(PyUnicode_DATA(token), p + i, (size_t)length);
    } else {
        token = PyUnicode_DecodeUTF8((const char *)p + i, length, "strict");
        if (token == NULL)
            return NULL;
    }
    PyObject *value;
    if (ascii && st->scanner.intern.symbols != NULL && is_ascii_uri(p, i, k)) {
        /* A URI: made here, as new_name_atom makes it, and not looked up nor put in the
         * token cache (a URI has no identity to keep: the memo in front serves the ones
         * that recur, and a new one costs no lookup and no insert). */
        value = cbcl_new_atom(&st->values, 2, token);
    } else if ((value = PyDict_GetItemWithError(cache, token)) != NULL) {
        Py_INCREF(value);
    } else if (!PyErr_Occurred()) {
        int made = ascii ? new_name_atom(st, p, i, k, token, cache, &value) : 0;
        if (made < 0) {
            value = NULL;
        } else if (made == 0) {
            if (gc_paused) /* (Python code runs with the collector as its caller left it) */
                PyGC_Enable();
            value = PyObject_CallFunction(make_atom, "On", token, max_name);
            if (gc_paused)
                PyGC_Disable();
        }
    }
    if (slot != NULL && value != NULL && value != Py_None)
        memo_keep(slot, 0, token, value);
    Py_DECREF(token);
    return value;
}

/* The character index of byte index `at` of the UTF-8 of `text` (equal for ASCII). */
static Py_ssize_t
char_index(const unsigned char *p, Py_ssize_t at, int ascii)
{
    return ascii ? at : chars_of(p, 0, at);
}

static PyObject *
read_value(PyObject *module, PyObject *args)
{
    NativeState *st = native_state(module);
    if (st == NULL)
        return NULL;
    PyObject *text, *cache, *make_atom, *utf8 = Py_None;
    Py_ssize_t pos, depth_left, max_items, budget, max_string, max_name, end, nodes;
    if (!PyArg_ParseTuple(args, "UnO!Onnnnn|O", &text, &pos, &PyDict_Type, &cache,
                          &make_atom, &depth_left, &max_items, &budget, &max_string,
                          &max_name, &utf8))
        return NULL;
    if (utf8 != Py_None && !PyBytes_CheckExact(utf8)) {
        PyErr_SetString(PyExc_TypeError, "utf8 must be the text's UTF-8 (bytes) or None");
        return NULL;
    }
    PyObject *value = cbcl_read_value_of(st, text, pos, cache, make_atom, depth_left,
                                         max_items, budget, max_string, max_name, utf8, &end,
                                         &nodes);
    if (value == NULL || value == Py_None)
        return value;
    return Py_BuildValue("(Nnn)", value, end, nodes);
}

/* read_value's work, read_value's arguments checked (text a str, cache a dict, utf8 the
 * text's UTF-8 as bytes or Py_None); also called directly by speedups.c's parse entry. */
PyObject *
cbcl_read_value_of(NativeState *st, PyObject *text, Py_ssize_t pos, PyObject *cache,
                   PyObject *make_atom, Py_ssize_t depth_left, Py_ssize_t max_items,
                   Py_ssize_t budget, Py_ssize_t max_string, Py_ssize_t max_name,
                   PyObject *utf8, Py_ssize_t *end_out, Py_ssize_t *nodes_out)
{
    const unsigned char *p;
    Py_ssize_t n, i;
    int ascii = PyUnicode_IS_ASCII(text);
    if (ascii) {
        p = PyUnicode_DATA(text);
        n = PyUnicode_GET_LENGTH(text);
        if (pos < 0 || pos > n)
            Py_RETURN_NONE;
        i = pos;
    } else {
        if (utf8 != Py_None) { /* the bytes the text was decoded from: not encoded again */
            p = (const unsigned char *)PyBytes_AS_STRING(utf8);
            n = PyBytes_GET_SIZE(utf8);
        } else {
            p = (const unsigned char *)PyUnicode_AsUTF8AndSize(text, &n);
            if (p == NULL) { /* a lone surrogate: the Python reference say so */
                PyErr_Clear();
                Py_RETURN_NONE;
            }
        }
        /* Only from the start: finding character `pos` in the UTF-8 would cost `pos`
         * steps a call, and a caller reading value after value (read_all, the error
         * paths) would pay the text's length per value. The Python reference index the str. */
        if (pos != 0)
            Py_RETURN_NONE;
        i = 0;
    }

    Stack stack = STACK_INIT; /* the lists under way (cbcl/_native_src/cstack.h) */
    PyObject *value = NULL;
    PyObject *result = NULL;
    Py_ssize_t nodes = 0, end = 0;
    /* No collection while the value is read: the atoms and tuples made here are untracked
     * as they are made (they refer to nothing a cycle could hold), yet each allocation
     * counts toward the next collection, and on 3.11 a collection runs inside the
     * allocation that passes the threshold: a body of new names set off one every 700
     * atoms (a fifth of the instructions of reading it). Put off to the first allocation
     * after the read (the collector as its caller left it: see read_atom). */
    int gc_paused = PyGC_Disable();
    for (;;) {
        i = skip_blank(p, i, n);
        if (i >= n)
            goto bail; /* the text ends inside the value, or before it */
        unsigned char c = p[i];
        if (c == '(') {
            if (++nodes > budget || stack.depth >= depth_left)
                goto bail; /* (the new list is stack.depth + 1 deep) */
            if (push_open(&stack) < 0)
                goto error;
            i++;
            continue;
        }
        if (c == ')') {
            if (stack.depth == 0)
                goto bail;
            if (top_items(&stack) > max_items)
                goto bail;
            if ((value = pop_tuple(&stack, &st->values)) == NULL)
                goto error;
            i++;
            if (stack.depth == 0) {
                end = i;
                goto done;
            }
            if (push_item(&stack, value) < 0)
                goto error;
            value = NULL;
            continue;
        }
        if (++nodes > budget)
            goto bail;
        if (c == '"') {
            value = read_string(p, i, n, max_string, &end);
        } else {
            Py_ssize_t k = i;
            unsigned char high = 0; /* the high bit: whether the run is not ASCII */
            size_t hash = 2166136261u; /* its memo_hash (cstack.h, kind 0), as it is scanned */
            while (!ends_atom[p[k]]) { /* (p[n] is NUL: ends_atom) */
                unsigned char b = p[k++];
                high |= b;
                hash = (hash ^ b) * 16777619u;
            }
            if (k < n && (p[k] == '"' || p[k] == 0))
                goto bail; /* an atom a string follows without a delimiter; a NUL */
            value = read_atom(st, p, i, k, !(high & 0x80), hash ^ (hash >> 15), cache,
                              make_atom, max_name, gc_paused);
            end = k;
        }
        if (value == NULL)
            goto error;
        if (value == Py_None)
            goto bail;
        i = end;
        if (stack.depth == 0)
            goto done; /* the value is one atom */
        if (push_item(&stack, value) < 0)
            goto error;
        value = NULL;
    }
done:
    *end_out = end == n ? PyUnicode_GET_LENGTH(text) : char_index(p, end, ascii);
    *nodes_out = nodes;
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
    Py_XDECREF(value);
    stack_free(&stack);
    return result;
}

/* decimal_layout_holds(type) -> (bool, bool): whether cstack.h's layout check holds for
 * `type`, and whether its objects may be untracked; for the tests (which hand it types
 * it must refuse). Changes nothing. */
static PyObject *
decimal_layout_holds_for(PyObject *Py_UNUSED(self), PyObject *type)
{
    int untrackable = 0, holds = decimal_layout_holds(type, &untrackable);
    if (holds < 0)
        return NULL;
    return Py_BuildValue("(OO)", holds ? Py_True : Py_False,
                         untrackable ? Py_True : Py_False);
}

PyMethodDef cbcl_scanner_methods[] = {
    {"decimal_layout_holds", decimal_layout_holds_for, METH_O,
     "decimal_layout_holds(type, /) -> (bool, bool): whether the Decimal layout check of "
     "cbcl/_native_src/cstack.h holds for type, and whether its objects may be untracked "
     "(for the tests)."},
    {"setup_intern", setup_intern, METH_VARARGS,
     "setup_intern(symbols, keywords, cache_chars, cache_max[, cache]) -> None: the "
     "reader's intern tables (NameTables) and its token cache's bounds, so new names are "
     "interned without a call into Python; cache, the reader's token cache, is emptied "
     "when a table is."},
    {"forget_atoms", forget_atoms, METH_NOARGS,
     "forget_atoms() -> None: the native memos of atoms (and the token cache setup_intern "
     "was given) emptied, as when an intern table is emptied."},
    {"read_value", read_value, METH_VARARGS,
     "read_value(text, pos, cache, make_atom, depth_left, max_items, budget, max_string, "
     "max_name[, utf8]) -> (value, end, nodes) | None: the value at character pos, or "
     "None to leave it to the Python reference."},
    {NULL, NULL, 0, NULL},
};

/* The value types and the Decimal layout check (cstack.h: st->values, which speedups.c
 * reads too). */
int
cbcl_scanner_exec(PyObject *Py_UNUSED(module), NativeState *st)
{
    if (init_value_types(&st->values) < 0)
        return -1;
    int in_place = check_atoms_in_place(&st->values);
    if (in_place < 0)
        return -1;
    st->values.atoms_in_place = in_place;
    return 0;
}

int
cbcl_scanner_traverse(NativeState *st, visitproc visit, void *arg)
{
    for (int k = 0; k < 3; k++)
        Py_VISIT(st->values.inert[k]);
    Py_VISIT(st->values.decimal);
    for (int k = 0; k < MEMO_SLOTS; k++) {
        Py_VISIT(st->scanner.memo[k].key);
        Py_VISIT(st->scanner.memo[k].value);
    }
    Py_VISIT(st->scanner.intern.symbols);
    Py_VISIT(st->scanner.intern.keywords);
    Py_VISIT(st->scanner.intern.cache);
    return 0;
}

void
cbcl_scanner_clear(NativeState *st)
{
    for (int k = 0; k < MEMO_SLOTS; k++) {
        Py_CLEAR(st->scanner.memo[k].key);
        Py_CLEAR(st->scanner.memo[k].value);
    }
    Py_CLEAR(st->scanner.intern.symbols);
    Py_CLEAR(st->scanner.intern.keywords);
    Py_CLEAR(st->scanner.intern.cache);
    for (int k = 0; k < 3; k++)
        Py_CLEAR(st->values.inert[k]);
    Py_CLEAR(st->values.decimal);
    st->values.in_place = st->values.untrackable = st->values.atoms_in_place = 0;
}
