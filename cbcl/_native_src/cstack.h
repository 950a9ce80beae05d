/* What the C readers share (cbcl/_native_src/scanner.c: text; cbcl/_native_src/speedups.c: binary frames): the
 * types of the values they make, and the values of the lists under way: the items of every open list one after another in
 * `items`, and where each open list's items start in `opens`. A list's close makes the
 * tuple of the top list's items directly (no Python list per list), and a tuple that can
 * be in no reference cycle is untracked by the cyclic collector as it is made. Included
 * by both, static: each unit has its own copy of the code; the types and the outcome of
 * the Decimal layout check are the module's state (native.h's ValueTypes, made once by
 * the scanner's set-up), passed to what reads them. */
#ifndef CBCL_CSTACK_H
#define CBCL_CSTACK_H

#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stdint.h>
#include <string.h>
#include "native.h" /* (ValueTypes, MemoSlot) */

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

/* vt's types: cbcl's Symbol, Keyword and URI, str subclasses of empty __slots__, which
 * hold no reference; and decimal.Decimal, as the Python readers make decimals. Set by the
 * module's exec (init_value_types; strong references, until m_clear). */
static int decimal_layout_ok(ValueTypes *vt);

/* (inline: the unit that does not run it, speedups.c, does not warn; scanner.c's exec does) */
static inline int
init_value_types(ValueTypes *vt)
{
    PyObject *decimal = PyImport_ImportModule("decimal");
    if (decimal == NULL)
        return -1;
    vt->decimal = PyObject_GetAttrString(decimal, "Decimal");
    Py_DECREF(decimal);
    if (vt->decimal == NULL)
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
        vt->inert[k] = (PyTypeObject *)type;
    }
    Py_DECREF(values);
    return decimal_layout_ok(vt) < 0 ? -1 : 0;
}

/* Decimals made in place. Decimal(text) costs ~0.25 us, most of it argument parsing and
 * libmpdec's general string reader; a CBCL decimal (is_decimal: -?digits.digits) of at
 * most DECIMAL_WORD_DIGITS significant digits is one coefficient word and an exponent, so
 * decimal_in_place writes the object _decimal's own constructor would write: its mpd_t,
 * with the coefficient in the object's inline data, laid out as DecimalLayout. That layout
 * is CPython's (Modules/_decimal: PyDecObject, libmpdec's mpd_t), not a public API, so
 * init_value_types checks it first, in each module object (decimal_layout_holds, on the
 * interpreter's own decimal.Decimal: in a subinterpreter without _decimal, _pydecimal's,
 * which it refuses): the type's size, then, field by
 * field, the decimals _decimal makes of sample texts against the ones made here, their
 * text, hash and value, and how the cyclic collector sees them. Where it does not hold,
 * every decimal is Decimal(text).
 *
 * The collector. Up to 3.12 Decimal is not a GC type; from 3.13 it is (a heap type whose
 * objects visit their type), and _decimal's objects are tracked. The object is allocated
 * by the type's own tp_alloc, which allocates the GC header in front of the object when
 * the type has one and tracks the object, as _decimal's do: the check requires that ours
 * and theirs agree (a GC type or not; tracked or not) and that the PyObject fields sit
 * where DecimalLayout says (the header is before the object pointer, not in the struct).
 *
 * Untracking. A Decimal is immutable and refers to nothing but its type, so it can be in
 * no reference cycle the type is not in: on 3.13 the readers untrack the Decimals they
 * put in a body (decimal_untrackable: the check found, by the type's tp_traverse, that a
 * sample visits its type and nothing else), so that a tuple of atoms and decimals is
 * still untracked (is_inert), as on 3.11 and 3.12. Where tp_traverse visits anything else,
 * Decimals stay tracked and tuples that hold them stay tracked (CPython's own rule). */
typedef struct {
    uint8_t flags; /* MPD_NEG, MPD_STATIC, MPD_STATIC_DATA ... */
    Py_ssize_t exp, digits, len, alloc;
    uint64_t *data;
} DecimalMpd;

typedef struct {
    PyObject_HEAD
    Py_hash_t hash;
    DecimalMpd dec;
    uint64_t data[4]; /* the words _decimal keeps inline (its DEC_MINALLOC) */
} DecimalLayout;

enum { MPD_NEG_FLAG = 1, MPD_STATIC_FLAGS = 16 | 32 }; /* MPD_STATIC | MPD_STATIC_DATA */
#define DECIMAL_WORD_DIGITS 19 /* MPD_RDIGITS: a word holds 10**19 - 1 */

/* The Decimal of type `type` of p[0:n], a CBCL decimal token, made in place (the layout
 * check must have held for `type`): a new reference; NULL with an exception; or Py_None
 * (a new reference) if its coefficient is longer than one word. */
static PyObject *
decimal_in_place(PyTypeObject *type, const unsigned char *p, Py_ssize_t n)
{
    Py_ssize_t fraction = 0, digits = 0;
    int negative = n > 0 && p[0] == '-', after_point = 0;
    uint64_t coefficient = 0;
    for (Py_ssize_t i = negative; i < n; i++) {
        unsigned char c = p[i];
        if (c == '.') {
            after_point = 1;
            continue;
        }
        fraction += after_point;
        if (digits == 0 && c == '0')
            continue; /* a leading zero */
        if (++digits > DECIMAL_WORD_DIGITS)
            Py_RETURN_NONE;
        coefficient = coefficient * 10 + (uint64_t)(c - '0');
    }
    /* tp_alloc: zeroed, the GC header (if any) in front, tracked if a GC type */
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

/* A finite number as sign, one-word coefficient and exponent (value = ±coefficient *
 * 10**exponent), and its coefficient's digits. */
typedef struct {
    int negative;
    uint64_t coefficient;
    Py_ssize_t exponent, digits;
} SmallNumber;

enum { MPD_SPECIAL_FLAGS = 2 | 4 | 8 }; /* MPD_INF | MPD_NAN | MPD_SNAN */

/* `number` as a SmallNumber, where it is an exact int within a machine word or a Decimal
 * of the checked layout (vt->in_place) that is finite with a one-word coefficient: 1, or 0
 * for anything else (the caller compares in Python). Raises nothing. */
static inline int
small_number_of(const ValueTypes *vt, PyObject *number, SmallNumber *out)
{
    if (PyLong_CheckExact(number)) {
        int overflow;
        long long v = PyLong_AsLongLongAndOverflow(number, &overflow);
        if (overflow || (v == -1 && PyErr_Occurred())) {
            PyErr_Clear();
            return 0;
        }
        out->negative = v < 0;
        out->coefficient = v < 0 ? 0 - (uint64_t)v : (uint64_t)v;
        out->exponent = 0;
        Py_ssize_t digits = 1;
        for (uint64_t c = out->coefficient; c >= 10; c /= 10)
            digits++;
        out->digits = digits;
        return 1;
    }
    if (!vt->in_place || Py_TYPE(number) != (PyTypeObject *)vt->decimal)
        return 0;
    const DecimalMpd *d = &((const DecimalLayout *)number)->dec;
    if ((d->flags & MPD_SPECIAL_FLAGS) || d->len != 1 || d->digits < 1 ||
            d->digits > DECIMAL_WORD_DIGITS)
        return 0;
    out->negative = d->flags & MPD_NEG_FLAG;
    out->coefficient = d->data[0];
    out->exponent = d->exp;
    out->digits = d->digits;
    return 1;
}

/* -1, 0 or 1 as a < b, a == b, a > b (exact, as Decimal compares). */
static inline int
small_number_compare(const SmallNumber *a, const SmallNumber *b)
{
    int a_zero = a->coefficient == 0, b_zero = b->coefficient == 0;
    if (a_zero || b_zero) {
        if (a_zero && b_zero)
            return 0;
        if (a_zero)
            return b->negative ? 1 : -1;
        return a->negative ? -1 : 1;
    }
    if (a->negative != b->negative)
        return a->negative ? -1 : 1;
    int sign = a->negative ? -1 : 1; /* (magnitudes compared below) */
    Py_ssize_t a_adjusted = a->exponent + a->digits - 1, b_adjusted = b->exponent + b->digits - 1;
    if (a_adjusted != b_adjusted)
        return a_adjusted > b_adjusted ? sign : -sign;
    /* the same adjusted exponent: the exponents differ by the digits' difference (< 19), so
     * the coefficient with fewer digits scaled to the other's stays within 19 digits */
    uint64_t ca = a->coefficient, cb = b->coefficient;
    for (Py_ssize_t k = a->exponent; k > b->exponent; k--)
        ca *= 10;
    for (Py_ssize_t k = b->exponent; k > a->exponent; k--)
        cb *= 10;
    return ca == cb ? 0 : ca > cb ? sign : -sign;
}

/* The Decimal of p[0:n], a CBCL decimal token: a new reference, or NULL with an exception.
 * `text`: that token as a str, or NULL (made here if Decimal(text) must make it). */
static PyObject *
decimal_of(const ValueTypes *vt, const unsigned char *p, Py_ssize_t n, PyObject *text)
{
    if (vt->in_place) {
        PyObject *made = decimal_in_place((PyTypeObject *)vt->decimal, p, n);
        if (made != Py_None)
            return made;
        Py_DECREF(made);
    }
    if (text != NULL)
        return PyObject_CallOneArg(vt->decimal, text);
    PyObject *made = PyUnicode_FromStringAndSize((const char *)p, n);
    if (made == NULL)
        return NULL;
    PyObject *value = PyObject_CallOneArg(vt->decimal, made);
    Py_DECREF(made);
    return value;
}

/* decimal_untrackable's visitor: counts the objects visited that are not `arg`'s type. */
typedef struct {
    PyObject *type;
    int others;
} VisitCount;

static int
visit_count(PyObject *object, void *arg)
{
    VisitCount *count = arg;
    if (object != count->type)
        count->others++;
    return 0;
}

/* Whether `sample`, a Decimal, may be untracked: not a GC object at all, or one whose
 * tp_traverse visits its type and nothing else (see above). */
static int
decimal_untrackable(PyObject *sample)
{
    if (!PyObject_IS_GC(sample))
        return 1;
    traverseproc traverse = Py_TYPE(sample)->tp_traverse;
    if (traverse == NULL)
        return 0;
    VisitCount count = {(PyObject *)Py_TYPE(sample), 0};
    return traverse(sample, visit_count, &count) == 0 && count.others == 0;
}

/* Whether decimal_in_place may make decimals of `type` (see above): 1, 0, or -1 with an
 * exception; *untrackable (if 1) whether they may be untracked. */
static int
decimal_layout_holds(PyObject *decimal_type, int *untrackable)
{
    static const char *const samples[] = {
        "0.0", "-0.0", "0.00000", "-0.50", "1.5", "-934.32", "551.79", "10.0", "100.001",
        "0.000000000000000000001", "999999999999999999.9", "-999999999.9999999999",
        "1234567890123456789.0", "0.1234567890123456789", "000.10",
        "12345678901234567890.5" /* (20 digits: Decimal(text) makes it) */};
    *untrackable = 0;
    if (!PyType_Check(decimal_type))
        return 0;
    PyTypeObject *type = (PyTypeObject *)decimal_type;
    if (type->tp_basicsize != (Py_ssize_t)sizeof(DecimalLayout) ||
            strcmp(type->tp_name, "decimal.Decimal") != 0 || type->tp_itemsize != 0 ||
            type->tp_alloc == NULL)
        return 0;
    int holds = 1, all_untrackable = 1;
    for (size_t k = 0; holds && k < sizeof samples / sizeof samples[0]; k++) {
        const unsigned char *p = (const unsigned char *)samples[k];
        Py_ssize_t n = (Py_ssize_t)strlen(samples[k]);
        PyObject *text = PyUnicode_FromStringAndSize(samples[k], n);
        PyObject *theirs = text == NULL ? NULL : PyObject_CallOneArg(decimal_type, text);
        PyObject *ours = theirs == NULL ? NULL : decimal_in_place(type, p, n);
        if (ours == NULL) {
            Py_XDECREF(text);
            Py_XDECREF(theirs);
            return -1;
        }
        if (ours == Py_None) /* (longer than a word: Decimal(text) makes it) */
            goto next;
        const DecimalLayout *a = (const DecimalLayout *)theirs, *b = (const DecimalLayout *)ours;
        holds = Py_TYPE(theirs) == type && Py_TYPE(ours) == type &&
                /* the collector sees ours as it sees theirs */
                PyObject_IS_GC(theirs) == PyObject_IS_GC(ours) &&
                (!PyObject_IS_GC(theirs) ||
                 PyObject_GC_IsTracked(theirs) == PyObject_GC_IsTracked(ours)) &&
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
            all_untrackable = all_untrackable && decimal_untrackable(theirs) &&
                              decimal_untrackable(ours);
        }
    next:
        Py_DECREF(text);
        Py_DECREF(theirs);
        Py_DECREF(ours);
        if (PyErr_Occurred())
            return -1;
    }
    *untrackable = holds && all_untrackable;
    return holds;
}

static int
decimal_layout_ok(ValueTypes *vt)
{
    int untrackable = 0, holds = decimal_layout_holds(vt->decimal, &untrackable);
    vt->in_place = holds == 1;
    vt->untrackable = holds == 1 && untrackable;
    return holds;
}

/* The memos of atoms by their text's bytes (MemoSlot, native.h: the text reader's token
 * memo, the binary decoder's atom memo, both in the module's state). A hit costs a hash
 * of the bytes and one comparison, no str made; a new atom takes its slot's place. */

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
 * track (exact str, int, Decimal up to 3.12), an untracked tuple, or a cbcl atom. A
 * Decimal of the GC type of 3.13 is untracked here, then inert, where the layout check
 * found that it refers to its type only (vt->untrackable, see above); else it is not
 * inert (a GC object: CPython's own rule for the tuples that hold it). */
static int
is_inert(const ValueTypes *vt, PyObject *value)
{
    PyTypeObject *type = Py_TYPE(value); /* (the types a body holds first: no calls) */
    if (type == &PyUnicode_Type || type == &PyLong_Type || type == vt->inert[0] ||
            type == vt->inert[1] || type == vt->inert[2])
        return 1;
    if (type == &PyTuple_Type)
        return !PyObject_GC_IsTracked(value);
    if (!PyObject_IS_GC(value))
        return 1;
    if ((PyObject *)type == vt->decimal && vt->untrackable) {
        PyObject_GC_UnTrack(value); /* (immutable; visits only its type) */
        return 1;
    }
    return 0;
}

/* The tuple of the top list's items, moved out of the stack, and the list closed: a new
 * reference, or NULL with MemoryError (the items are then still on the stack). A tuple of
 * inert items can be in no cycle and is untracked, as CPython's collector itself would
 * untrack it at its first pass, so that reading a large body sets off no collection that
 * walks what it has built. */
static PyObject *
pop_tuple(Stack *st, const ValueTypes *vt)
{
    Py_ssize_t from = st->opens[st->depth - 1], count = st->size - from;
    PyObject *tuple = PyTuple_New(count);
    if (tuple == NULL)
        return NULL;
    int inert = 1;
    for (Py_ssize_t j = 0; j < count; j++) {
        PyObject *item = st->items[from + j];
        if (inert && !is_inert(vt, item))
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
