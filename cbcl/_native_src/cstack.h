/* What the C readers share (cbcl/_native_src/scanner.c: text; cbcl/_native_src/speedups.c: binary frames): the
 * types of the values they make, and the values of the lists under way: the items of every open list one after another in
 * `items`, and where each open list's items start in `opens`. A list's close makes the
 * tuple of the top list's items directly (no Python list per list), and a tuple that can
 * be in no reference cycle is untracked by the cyclic collector as it is made. Included
 * by both, static: each module has its own copy. */
#ifndef CBCL_CSTACK_H
#define CBCL_CSTACK_H

#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stdint.h>
#include <string.h>

typedef struct {
    PyObject **items; /* owned references, items[0:size] */
    Py_ssize_t size, capacity;
    Py_ssize_t *opens; /* where each open list's items start, opens[0:depth] */
    Py_ssize_t depth, open_capacity;
} Stack;

#define STACK_INIT {NULL, 0, 0, NULL, 0, 0}

/* Push `value` on the top list: steals the reference, even on failure (-1, MemoryError). */
static int
push_item(Stack *st, PyObject *value)
{
    if (st->size == st->capacity) {
        Py_ssize_t more = st->capacity ? 2 * st->capacity : 64;
        PyObject **grown = PyMem_Realloc(st->items, (size_t)more * sizeof(PyObject *));
        if (grown == NULL) {
            Py_DECREF(value);
            PyErr_NoMemory();
            return -1;
        }
        st->items = grown;
        st->capacity = more;
    }
    st->items[st->size++] = value;
    return 0;
}

/* Open a list: 0, or -1 with MemoryError. */
static int
push_open(Stack *st)
{
    if (st->depth == st->open_capacity) {
        Py_ssize_t more = st->open_capacity ? 2 * st->open_capacity : 16;
        Py_ssize_t *grown = PyMem_Realloc(st->opens, (size_t)more * sizeof(Py_ssize_t));
        if (grown == NULL) {
            PyErr_NoMemory();
            return -1;
        }
        st->opens = grown;
        st->open_capacity = more;
    }
    st->opens[st->depth++] = st->size;
    return 0;
}

/* The longest decimal text (cbcl.core._vocabulary.MAX_DECIMAL_CHARS). */
#define MAX_DECIMAL_CHARS 40

/* Whether the bytes p[i:k] are a decimal token: -?(0|[1-9][0-9]*)\.[0-9]+ (DECIMAL_RE;
 * its length is the caller's to check against MAX_DECIMAL_CHARS). */
static int
is_decimal(const unsigned char *p, Py_ssize_t i, Py_ssize_t k)
{
    if (i < k && p[i] == '-')
        i++;
    if (i < k && p[i] == '0') {
        i++;
    } else if (i < k && p[i] >= '1' && p[i] <= '9') {
        while (i < k && p[i] >= '0' && p[i] <= '9')
            i++;
    } else {
        return 0;
    }
    if (i >= k || p[i] != '.')
        return 0;
    Py_ssize_t digits = ++i;
    while (i < k && p[i] >= '0' && p[i] <= '9')
        i++;
    return i > digits && i == k;
}

/* cbcl's Symbol, Keyword and URI: str subclasses of empty __slots__, which hold no
 * reference; and decimal.Decimal, as the Python readers make decimals. Set by the
 * module's init (init_value_types). */
static PyTypeObject *InertTypes[3];
static PyObject *DecimalType;

static int decimal_layout_ok(void);

static int
init_value_types(void)
{
    PyObject *decimal = PyImport_ImportModule("decimal");
    if (decimal == NULL)
        return -1;
    DecimalType = PyObject_GetAttrString(decimal, "Decimal"); /* kept for the module's life */
    Py_DECREF(decimal);
    if (DecimalType == NULL)
        return -1;
    PyObject *values = PyImport_ImportModule("cbcl.core._values");
    if (values == NULL)
        return -1;
    const char *names[3] = {"Symbol", "Keyword", "URI"};
    for (int k = 0; k < 3; k++) {
        PyObject *type = PyObject_GetAttrString(values, names[k]);
        if (type == NULL || !PyType_Check(type)) {
            Py_XDECREF(type);
            Py_DECREF(values);
            if (!PyErr_Occurred())
                PyErr_SetString(PyExc_TypeError, "cbcl.core._values has no atom type");
            return -1;
        }
        InertTypes[k] = (PyTypeObject *)type; /* kept for the module's life */
    }
    Py_DECREF(values);
    return decimal_layout_ok() < 0 ? -1 : 0;
}

/* Decimals made in place. Decimal(text) costs ~0.25 us, most of it argument parsing and
 * libmpdec's general string reader; a CBCL decimal (is_decimal: -?digits.digits) of at
 * most DECIMAL_WORD_DIGITS significant digits is one coefficient word and an exponent, so
 * decimal_of writes the object _decimal's own constructor would write: its mpd_t, with the
 * coefficient in the object's inline data, laid out as DecimalLayout. That layout is
 * CPython's (Modules/_decimal: PyDecObject, libmpdec's mpd_t), not a public API, so
 * init_value_types checks it first (decimal_layout_ok): the type's size, then, field by
 * field, the decimals _decimal makes of sample texts against the ones made here, and their
 * text, hash and value. Where it does not hold, every decimal is Decimal(text). */
typedef struct {
    uint8_t flags; /* MPD_NEG, MPD_STATIC, MPD_STATIC_DATA ... */
    Py_ssize_t exp, digits, len, alloc;
    uint64_t *data;
} DecimalMpd;

typedef struct {
    PyObject_HEAD
    Py_hash_t hash;
    DecimalMpd dec;
    uint64_t data[4]; /* _Py_DEC_MINALLOC words, inline */
} DecimalLayout;

enum { MPD_NEG_FLAG = 1, MPD_STATIC_FLAGS = 16 | 32 }; /* MPD_STATIC | MPD_STATIC_DATA */
#define DECIMAL_WORD_DIGITS 19 /* MPD_RDIGITS: a word holds 10**19 - 1 */
static int DecimalInPlace; /* 1: decimal_layout_ok held */

/* The Decimal of p[0:n], a CBCL decimal token: a new reference, or NULL with an exception.
 * `text`: that token as a str, or NULL (made here if Decimal(text) must make it). */
static PyObject *
decimal_of(const unsigned char *p, Py_ssize_t n, PyObject *text)
{
    if (DecimalInPlace) {
        Py_ssize_t i = 0, fraction = 0, digits = 0;
        int negative = n > 0 && p[0] == '-', after_point = 0;
        uint64_t coefficient = 0;
        for (i = negative; i < n; i++) {
            unsigned char c = p[i];
            if (c == '.') {
                after_point = 1;
                continue;
            }
            fraction += after_point;
            if (digits == 0 && c == '0')
                continue; /* a leading zero */
            if (++digits > DECIMAL_WORD_DIGITS)
                break;
            coefficient = coefficient * 10 + (uint64_t)(c - '0');
        }
        if (digits <= DECIMAL_WORD_DIGITS) {
            PyTypeObject *type = (PyTypeObject *)DecimalType;
            DecimalLayout *d = (DecimalLayout *)type->tp_alloc(type, 0);
            if (d == NULL)
                return NULL;
            d->hash = -1;
            d->dec.flags = (uint8_t)(MPD_STATIC_FLAGS | (negative ? MPD_NEG_FLAG : 0));
            d->dec.exp = -fraction;
            d->dec.digits = digits ? digits : 1;
            d->dec.len = 1;
            d->dec.alloc = 4;
            d->dec.data = d->data;
            d->data[0] = coefficient;
            return (PyObject *)d;
        }
    }
    if (text != NULL)
        return PyObject_CallOneArg(DecimalType, text);
    PyObject *made = PyUnicode_FromStringAndSize((const char *)p, n);
    if (made == NULL)
        return NULL;
    PyObject *value = PyObject_CallOneArg(DecimalType, made);
    Py_DECREF(made);
    return value;
}

/* Whether decimal_of may make decimals in place (see above): 1, 0, or -1. */
static int
decimal_layout_ok(void)
{
    static const char *const samples[] = {
        "0.0", "-0.0", "0.00000", "-0.50", "1.5", "-934.32", "551.79", "10.0", "100.001",
        "0.000000000000000000001", "999999999999999999.9", "-999999999.9999999999",
        "1234567890123456789.0", "0.1234567890123456789", "000.10",
        "12345678901234567890.5" /* (20 digits: Decimal(text) makes it) */};
    PyTypeObject *type = (PyTypeObject *)DecimalType;
    if (!PyType_Check(DecimalType) || type->tp_basicsize != (Py_ssize_t)sizeof(DecimalLayout) ||
            strcmp(type->tp_name, "decimal.Decimal") != 0 || type->tp_itemsize != 0)
        return 0;
    int holds = 1;
    DecimalInPlace = 1; /* (for the samples: reset below unless every one agrees) */
    for (size_t k = 0; holds && k < sizeof samples / sizeof samples[0]; k++) {
        const unsigned char *p = (const unsigned char *)samples[k];
        Py_ssize_t n = (Py_ssize_t)strlen(samples[k]);
        PyObject *text = PyUnicode_FromStringAndSize(samples[k], n);
        PyObject *theirs = text == NULL ? NULL : PyObject_CallOneArg(DecimalType, text);
        PyObject *ours = theirs == NULL ? NULL : decimal_of(p, n, NULL);
        if (ours == NULL) {
            Py_XDECREF(text);
            Py_XDECREF(theirs);
            DecimalInPlace = 0;
            return -1;
        }
        const DecimalLayout *a = (const DecimalLayout *)theirs, *b = (const DecimalLayout *)ours;
        holds = Py_TYPE(theirs) == type && Py_TYPE(ours) == type &&
                a->dec.flags == b->dec.flags && a->dec.exp == b->dec.exp &&
                a->dec.digits == b->dec.digits && a->dec.len == b->dec.len &&
                a->dec.alloc == b->dec.alloc && a->dec.data == a->data &&
                b->dec.data == b->data && a->dec.len >= 1 && a->dec.len <= 4 &&
                memcmp(a->data, b->data, (size_t)a->dec.len * sizeof(uint64_t)) == 0;
        if (holds) { /* and what Python sees of them */
            PyObject *their_text = PyObject_Str(theirs), *our_text = PyObject_Str(ours);
            Py_hash_t their_hash = PyObject_Hash(theirs), our_hash = PyObject_Hash(ours);
            int equal = PyObject_RichCompareBool(theirs, ours, Py_EQ);
            holds = their_text != NULL && our_text != NULL && equal == 1 &&
                    their_hash != -1 && their_hash == our_hash &&
                    PyUnicode_Compare(their_text, our_text) == 0;
            Py_XDECREF(their_text);
            Py_XDECREF(our_text);
            if (PyErr_Occurred()) {
                Py_DECREF(text);
                Py_DECREF(theirs);
                Py_DECREF(ours);
                DecimalInPlace = 0;
                return -1;
            }
        }
        Py_DECREF(text);
        Py_DECREF(theirs);
        Py_DECREF(ours);
    }
    DecimalInPlace = holds;
    return holds;
}

/* A slot of a direct-mapped memo of atoms by their text's bytes (the text reader's token
 * memo, the binary decoder's atom memo): the text (an exact ASCII str) and the atom made
 * of it, under a kind (0 where the memo has one). A hit costs a hash of the bytes and one
 * comparison, no str made; a new atom takes its slot's place. */
typedef struct {
    PyObject *key;   /* the text, or NULL */
    PyObject *value; /* its atom */
    long kind;
} MemoSlot;

/* The memo hash (FNV-1a) of kind `kind` and the bytes p[0:n]; *ascii (if not NULL) says
 * whether they are all ASCII. */
static size_t
memo_hash(const unsigned char *p, Py_ssize_t n, long kind, int *ascii)
{
    size_t h = 2166136261u ^ (size_t)kind;
    unsigned char high = 0;
    for (Py_ssize_t j = 0; j < n; j++) {
        high |= p[j];
        h = (h ^ p[j]) * 16777619u;
    }
    if (ascii != NULL)
        *ascii = high < 0x80;
    return h ^ (h >> 15);
}

/* The atom `slot` holds for kind `kind` and text p[0:n] (a new reference), or NULL. */
static PyObject *
memo_hit(const MemoSlot *slot, long kind, const unsigned char *p, Py_ssize_t n)
{
    if (slot->key == NULL || slot->kind != kind || PyUnicode_GET_LENGTH(slot->key) != n ||
            memcmp(PyUnicode_DATA(slot->key), p, (size_t)n) != 0)
        return NULL;
    Py_INCREF(slot->value);
    return slot->value;
}

/* Keep `value`, the atom of kind `kind` written `text` (an exact ASCII str), in `slot`. */
static void
memo_keep(MemoSlot *slot, long kind, PyObject *text, PyObject *value)
{
    PyObject *old_key = slot->key, *old_value = slot->value;
    slot->key = Py_NewRef(text);
    slot->value = Py_NewRef(value);
    slot->kind = kind;
    Py_XDECREF(old_key);
    Py_XDECREF(old_value);
}

/* Whether `value` can hold no reference to a container: an object the collector does not
 * track (exact str, int, Decimal), an untracked tuple, or a cbcl atom. */
static int
is_inert(PyObject *value)
{
    PyTypeObject *type = Py_TYPE(value); /* (the types a body holds first: no calls) */
    if (type == &PyUnicode_Type || type == &PyLong_Type || type == InertTypes[0] ||
            type == InertTypes[1] || type == InertTypes[2])
        return 1;
    if (type == &PyTuple_Type)
        return !PyObject_GC_IsTracked(value);
    return !PyObject_IS_GC(value);
}

/* The tuple of the top list's items, moved out of the stack, and the list closed: a new
 * reference, or NULL with MemoryError (the items are then still on the stack). A tuple of
 * inert items can be in no cycle and is untracked, as CPython's collector itself would
 * untrack it at its first pass, so that reading a large body sets off no collection that
 * walks what it has built. */
static PyObject *
pop_tuple(Stack *st)
{
    Py_ssize_t from = st->opens[st->depth - 1], count = st->size - from;
    PyObject *tuple = PyTuple_New(count);
    if (tuple == NULL)
        return NULL;
    int inert = 1;
    for (Py_ssize_t j = 0; j < count; j++) {
        PyObject *item = st->items[from + j];
        if (inert && !is_inert(item))
            inert = 0;
        PyTuple_SET_ITEM(tuple, j, item);
    }
    st->size = from;
    st->depth--;
    if (inert && count > 0)
        PyObject_GC_UnTrack(tuple);
    return tuple;
}

/* The number of items of the top list. */
static Py_ssize_t
top_items(const Stack *st)
{
    return st->size - st->opens[st->depth - 1];
}

static void
stack_free(Stack *st)
{
    for (Py_ssize_t j = 0; j < st->size; j++)
        Py_DECREF(st->items[j]);
    PyMem_Free(st->items);
    PyMem_Free(st->opens);
}

#endif
