/* What the C readers share (cbcl/_scanner.c: text; cbcl/_speedups.c: binary frames): the
 * types of the values they make, and the values of the lists under way: the items of every open list one after another in
 * `items`, and where each open list's items start in `opens`. A list's close makes the
 * tuple of the top list's items directly (no Python list per list), and a tuple that can
 * be in no reference cycle is untracked by the cyclic collector as it is made. Included
 * by both, static: each module has its own copy. */
#ifndef CBCL_CSTACK_H
#define CBCL_CSTACK_H

#define PY_SSIZE_T_CLEAN
#include <Python.h>

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

/* The longest decimal text (cbcl._vocabulary.MAX_DECIMAL_CHARS). */
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
    PyObject *values = PyImport_ImportModule("cbcl._values");
    if (values == NULL)
        return -1;
    const char *names[3] = {"Symbol", "Keyword", "URI"};
    for (int k = 0; k < 3; k++) {
        PyObject *type = PyObject_GetAttrString(values, names[k]);
        if (type == NULL || !PyType_Check(type)) {
            Py_XDECREF(type);
            Py_DECREF(values);
            if (!PyErr_Occurred())
                PyErr_SetString(PyExc_TypeError, "cbcl._values has no atom type");
            return -1;
        }
        InertTypes[k] = (PyTypeObject *)type; /* kept for the module's life */
    }
    Py_DECREF(values);
    return 0;
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
