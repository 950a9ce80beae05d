/* The intern tables of names, in C (issue 35): cbcl._native.NameTable.
 *
 * Theory of operation
 * -------------------
 * A symbol or keyword read is interned: one object per name, process-wide (spec/cbcl-1.0.md,
 * "Process-wide memos"), so that the tables built from grammars and schemas find it by
 * identity. With a dict as the table, each new name cost a key str, a dict miss (SipHash of
 * the key, then a probe), an insert (with the dict's successive resizes) and, every
 * INTERN_MAX names, a PyDict_Clear: some 900 instructions of the ~1,590 a never-seen name
 * cost. Where the extension is built, cbcl.core._values makes its two tables
 * (SYMBOL_TABLE, KEYWORD_TABLE) of this type instead, and every reader, decoder and
 * constructor (Symbol(name), Keyword(name), intern_symbol) goes through them.
 *
 * A NameTable holds atom pointers only, no key: a name is compared with the atom's own
 * characters (length, kind, memcmp). Open addressing, linear probing, over 2^k >= 2 *
 * bound slots, allocated once: it never regrows, and holds at most `bound` atoms (load
 * <= 1/2, so a probe always ends on an empty slot). Each slot keeps the name's hash next to
 * the atom, so a probe reads the atom only when the hashes are equal. The hash is the one
 * Python gives the name as a str (for a 1-byte-kind str, CPython's _Py_HashBytes over its
 * characters: the randomised SipHash, so names a peer chooses cannot be made to collide),
 * taken from the scanned bytes, before any object is made, and stored into the new atom's
 * cached hash: computed once per name. That function is private before 3.14
 * (Py_HashBuffer from then on), so each table checks at creation that it gives hash(str)
 * for sample names; where it does not, a name is hashed through a str (slower, the same
 * table).
 *
 * The bound is the Python twin's (cbcl.core._reader._intern): a new name that finds the
 * table holding `bound` atoms first empties it (O(slots), slots = 2^k < 4 * bound: each
 * slot visited once per `bound` names), puts the pinned names back (the dict `pinned`,
 * name -> atom, the grammars' and schemas' literals, at most bound // 2) and has the
 * module's memos forget their atoms (cbcl_forget_memos, scanner.c), so no memo gives a
 * name's atom from before the emptying. The table is also a mutable mapping from Python
 * (get, [], in, len, iteration over the names, pop, clear, update), which the tests and
 * the Python reader's paths use; a name entered from Python is checked to be its atom's
 * text. Not thread-safe beyond the GIL (the module declares it needs the GIL).
 */
#include "intern.h"

#if PY_VERSION_HEX >= 0x030E0000
static Py_hash_t
hash_of_bytes(const void *p, Py_ssize_t n)
{
    return Py_HashBuffer(p, n);
}
#else
/* str's hash of the characters of a 1-byte-kind str (unicode_hash: _Py_HashBytes over
 * its data): exported by 3.11 to 3.13, declared by 3.11 and 3.12 only. */
PyAPI_FUNC(Py_hash_t) _Py_HashBytes(const void *, Py_ssize_t);

static Py_hash_t
hash_of_bytes(const void *p, Py_ssize_t n)
{
    return _Py_HashBytes(p, n);
}
#endif

/* Whether hash_of_bytes gives str's hash: 1, 0, or -1 with an exception. */
static int
bytes_hash_is_str_hash(void)
{
    static const char *const samples[] = {"", "a", "id", "purchase-order-7",
                                          "task-assignment/v1", "<=>?!*+-/._@%&"};
    for (size_t j = 0; j < sizeof samples / sizeof *samples; j++) {
        Py_ssize_t n = (Py_ssize_t)strlen(samples[j]);
        PyObject *text = PyUnicode_FromStringAndSize(samples[j], n);
        if (text == NULL)
            return -1;
        Py_hash_t theirs = PyObject_Hash(text);
        Py_DECREF(text);
        if (theirs == -1)
            return -1;
        if (hash_of_bytes(samples[j], n) != theirs)
            return 0;
    }
    return 1;
}

/* str's hash of the ASCII p[0:n], or -1 with an exception. */
static Py_hash_t
ascii_hash(const NameTable *t, const char *p, Py_ssize_t n)
{
    if (t->hash_of_bytes)
        return hash_of_bytes(p, n);
    PyObject *text = PyUnicode_FromStringAndSize(p, n);
    if (text == NULL)
        return -1;
    Py_hash_t hash = PyObject_Hash(text);
    Py_DECREF(text);
    return hash;
}

/* The slot holding the atom of the name of kind `kind` (1, 2 or 4 bytes a character),
 * `data` (n characters), hash `hash`, or the empty slot where it would go. */
static NameSlot *
find_slot(const NameTable *t, int kind, const void *data, Py_ssize_t n, Py_hash_t hash)
{
    size_t i = (size_t)hash & t->mask;
    for (;;) {
        NameSlot *s = &t->slots[i];
        PyObject *atom = s->atom;
        if (atom == NULL)
            return s;
        if (s->hash == hash && PyUnicode_GET_LENGTH(atom) == n &&
                (int)PyUnicode_KIND(atom) == kind &&
                memcmp(PyUnicode_DATA(atom), data, (size_t)n * (size_t)kind) == 0)
            return s;
        i = (i + 1) & t->mask;
    }
}

/* Every atom released, every slot empty. */
static void
empty_table(NameTable *t)
{
    NameSlot *slots = t->slots;
    t->used = 0;
    if (slots == NULL)
        return;
    for (size_t i = 0; i <= t->mask; i++) {
        PyObject *atom = slots[i].atom;
        if (atom != NULL) {
            slots[i].atom = NULL;
            Py_DECREF(atom);
        }
    }
}

/* str's hash of `text` (a str or a str subclass: str's own hash function, whatever the
 * subclass defines), or -1 with an exception. */
static Py_hash_t
str_hash(PyObject *text)
{
    return PyUnicode_Type.tp_hash(text);
}

/* The pinned names entered again after an emptying (at most bound of them: the pinned dict
 * holds at most bound // 2, but it is a dict anyone may change). 0, or -1 with an
 * exception. */
static int
refill_pinned(NameTable *t)
{
    if (t->pinned == NULL)
        return 0;
    PyObject *name, *atom;
    Py_ssize_t pos = 0;
    while (t->used < t->bound && PyDict_Next(t->pinned, &pos, &name, &atom)) {
        if (!PyUnicode_Check(name) || !PyUnicode_Check(atom))
            continue;
        Py_hash_t hash = str_hash(atom);
        if (hash == -1)
            return -1;
        NameSlot *s = find_slot(t, PyUnicode_KIND(atom), PyUnicode_DATA(atom),
                                PyUnicode_GET_LENGTH(atom), hash);
        if (s->atom == NULL) {
            s->hash = hash;
            s->atom = Py_NewRef(atom);
            t->used++;
        }
    }
    return 0;
}

/* Room for one more atom: 0 if there was; 1 if the table was full and has been emptied
 * down to its pinned names (the memos forgotten: a slot found before is stale); -1 with an
 * exception. */
static int
make_room(NativeState *st, NameTable *t)
{
    if (t->used < t->bound)
        return 0;
    empty_table(t);
    cbcl_forget_memos(st);
    return refill_pinned(t) < 0 ? -1 : 1;
}

/* Enter `atom` (a new reference, handed over) in the empty slot `s`. */
static void
put(NameTable *t, NameSlot *s, Py_hash_t hash, PyObject *atom)
{
    s->hash = hash;
    s->atom = atom;
    t->used++;
}

/* The interned atom of a name given as `name` (a str) or, `name` NULL, as the ASCII
 * data[0:n]: a new reference, or NULL with an exception. */
static PyObject *
intern_in(NativeState *st, NameTable *t, PyObject *name, int kind, const void *data,
          Py_ssize_t n, Py_hash_t hash)
{
    NameSlot *s = find_slot(t, kind, data, n, hash);
    if (s->atom != NULL)
        return Py_NewRef(s->atom);
    PyObject *atom = name != NULL ? cbcl_new_atom(&st->values, t->which, name) :
        cbcl_new_atom_ascii(&st->values, t->which, data, n, hash);
    if (atom == NULL)
        return NULL;
    int emptied = make_room(st, t);
    if (emptied < 0) {
        Py_DECREF(atom);
        return NULL;
    }
    if (emptied) {
        s = find_slot(t, kind, data, n, hash);
        if (s->atom != NULL) { /* (a pinned name the table lacked: the new atom wins, as
                                * the Python twin's table[name] = value) */
            Py_SETREF(s->atom, Py_NewRef(atom));
            return atom;
        }
    }
    put(t, s, hash, Py_NewRef(atom));
    return atom;
}

PyObject *
cbcl_names_intern_ascii(NativeState *st, NameTable *t, const char *p, Py_ssize_t n)
{
    Py_hash_t hash = ascii_hash(t, p, n);
    if (hash == -1)
        return NULL;
    return intern_in(st, t, NULL, PyUnicode_1BYTE_KIND, p, n, hash);
}

PyObject *
cbcl_names_intern(NativeState *st, NameTable *t, PyObject *name)
{
    Py_hash_t hash = str_hash(name);
    if (hash == -1)
        return NULL;
    return intern_in(st, t, name, PyUnicode_KIND(name), PyUnicode_DATA(name),
                     PyUnicode_GET_LENGTH(name), hash);
}

/* ------------------------------------------------------------------ the Python type */

static void name_table_dealloc(PyObject *self);

int
cbcl_is_name_table(PyObject *obj)
{
    return Py_TYPE(obj)->tp_dealloc == name_table_dealloc;
}

/* The state of the module whose type `self` is, or NULL with an exception. */
static NativeState *
table_state(PyObject *self)
{
    PyObject *module = PyType_GetModule(Py_TYPE(self));
    return module == NULL ? NULL : native_state(module);
}

/* The slot of `key` in `t`: *out the slot holding it, or NULL (not held: a key that is no
 * str is held by no table). 0, or -1 with an exception. */
static int
slot_of_key(NameTable *t, PyObject *key, NameSlot **out)
{
    *out = NULL;
    if (!PyUnicode_Check(key))
        return 0;
    Py_hash_t hash = str_hash(key);
    if (hash == -1)
        return -1;
    NameSlot *s = find_slot(t, PyUnicode_KIND(key), PyUnicode_DATA(key),
                            PyUnicode_GET_LENGTH(key), hash);
    *out = s->atom != NULL ? s : NULL;
    return 0;
}

/* Removes the atom of slot `s` (linear probing: the entries after it that would not be
 * found past the hole move back into it). */
static void
remove_slot(NameTable *t, NameSlot *s)
{
    size_t i = (size_t)(s - t->slots), j = i;
    PyObject *atom = s->atom;
    s->atom = NULL;
    t->used--;
    for (;;) {
        j = (j + 1) & t->mask;
        if (t->slots[j].atom == NULL)
            break;
        size_t home = (size_t)t->slots[j].hash & t->mask;
        /* the entry at j stays if its home lies cyclically in (i, j] */
        int stays = i <= j ? (home > i && home <= j) : (home > i || home <= j);
        if (!stays) {
            t->slots[i] = t->slots[j];
            t->slots[j].atom = NULL;
            i = j;
        }
    }
    Py_DECREF(atom);
}

static PyObject *
name_table_new(PyTypeObject *type, PyObject *args, PyObject *kwargs)
{
    int which;
    Py_ssize_t bound;
    PyObject *pinned;
    if (kwargs != NULL && PyDict_GET_SIZE(kwargs) != 0) {
        PyErr_SetString(PyExc_TypeError, "NameTable() takes positional arguments only");
        return NULL;
    }
    if (!PyArg_ParseTuple(args, "inO!:NameTable", &which, &bound, &PyDict_Type, &pinned))
        return NULL;
    if ((which != 0 && which != 1) || bound < 1 || bound > ((Py_ssize_t)1 << 40)) {
        PyErr_SetString(PyExc_ValueError,
                        "NameTable: which must be 0 (symbols) or 1 (keywords), bound >= 1");
        return NULL;
    }
    int bytes_ok = bytes_hash_is_str_hash();
    if (bytes_ok < 0)
        return NULL;
    size_t size = 8;
    while (size < 2 * (size_t)bound)
        size <<= 1;
    NameSlot *slots = PyMem_Calloc(size, sizeof(NameSlot));
    if (slots == NULL)
        return PyErr_NoMemory();
    NameTable *t = (NameTable *)type->tp_alloc(type, 0);
    if (t == NULL) {
        PyMem_Free(slots);
        return NULL;
    }
    t->slots = slots;
    t->mask = size - 1;
    t->used = 0;
    t->bound = bound;
    t->pinned = Py_NewRef(pinned);
    t->which = which;
    t->hash_of_bytes = bytes_ok;
    return (PyObject *)t;
}

static int
name_table_traverse(PyObject *self, visitproc visit, void *arg)
{
    NameTable *t = (NameTable *)self;
    Py_VISIT(Py_TYPE(self));
    Py_VISIT(t->pinned);
    if (t->slots != NULL)
        for (size_t i = 0; i <= t->mask; i++)
            Py_VISIT(t->slots[i].atom);
    return 0;
}

static int
name_table_clear(PyObject *self)
{
    NameTable *t = (NameTable *)self;
    Py_CLEAR(t->pinned);
    empty_table(t);
    return 0;
}

static void
name_table_dealloc(PyObject *self)
{
    PyTypeObject *type = Py_TYPE(self);
    PyObject_GC_UnTrack(self);
    name_table_clear(self);
    PyMem_Free(((NameTable *)self)->slots);
    type->tp_free(self);
    Py_DECREF(type);
}

static Py_ssize_t
name_table_length(PyObject *self)
{
    return ((NameTable *)self)->used;
}

static PyObject *
name_table_subscript(PyObject *self, PyObject *key)
{
    NameSlot *s;
    if (slot_of_key((NameTable *)self, key, &s) < 0)
        return NULL;
    if (s == NULL) {
        PyErr_SetObject(PyExc_KeyError, key);
        return NULL;
    }
    return Py_NewRef(s->atom);
}

/* table[name] = atom (atom's text must be name) or del table[name]. */
static int
name_table_ass_subscript(PyObject *self, PyObject *key, PyObject *value)
{
    NameTable *t = (NameTable *)self;
    NameSlot *s;
    if (slot_of_key(t, key, &s) < 0)
        return -1;
    if (value == NULL) {
        if (s == NULL) {
            PyErr_SetObject(PyExc_KeyError, key);
            return -1;
        }
        remove_slot(t, s);
        return 0;
    }
    if (!PyUnicode_Check(key) || !PyUnicode_Check(value) ||
            PyUnicode_Compare(key, value) != 0) {
        if (!PyErr_Occurred())
            PyErr_SetString(PyExc_ValueError, "a NameTable holds an atom under its own text");
        return -1;
    }
    if (s != NULL) {
        Py_SETREF(s->atom, Py_NewRef(value));
        return 0;
    }
    NativeState *st = table_state(self);
    if (st == NULL)
        return -1;
    int emptied = make_room(st, t);
    if (emptied < 0)
        return -1;
    Py_hash_t hash = str_hash(value);
    if (hash == -1)
        return -1;
    s = find_slot(t, PyUnicode_KIND(value), PyUnicode_DATA(value),
                  PyUnicode_GET_LENGTH(value), hash);
    if (s->atom != NULL) {
        Py_SETREF(s->atom, Py_NewRef(value));
        return 0;
    }
    put(t, s, hash, Py_NewRef(value));
    return 0;
}

static int
name_table_contains(PyObject *self, PyObject *key)
{
    NameSlot *s;
    if (slot_of_key((NameTable *)self, key, &s) < 0)
        return -1;
    return s != NULL;
}

/* The names held, as exact strs: a new list. */
static PyObject *
name_table_keys(PyObject *self, PyObject *Py_UNUSED(ignored))
{
    NameTable *t = (NameTable *)self;
    PyObject *names = PyList_New(0);
    if (names == NULL)
        return NULL;
    for (size_t i = 0; i <= t->mask; i++) {
        PyObject *atom = t->slots[i].atom;
        if (atom == NULL)
            continue;
        PyObject *name = PyUnicode_Substring(atom, 0, PyUnicode_GET_LENGTH(atom));
        if (name == NULL || PyList_Append(names, name) < 0) {
            Py_XDECREF(name);
            Py_DECREF(names);
            return NULL;
        }
        Py_DECREF(name);
    }
    return names;
}

static PyObject *
name_table_iter(PyObject *self)
{
    PyObject *names = name_table_keys(self, NULL);
    if (names == NULL)
        return NULL;
    PyObject *it = PyObject_GetIter(names);
    Py_DECREF(names);
    return it;
}

static PyObject *
name_table_get(PyObject *self, PyObject *const *args, Py_ssize_t nargs)
{
    if (nargs < 1 || nargs > 2) {
        PyErr_SetString(PyExc_TypeError, "get(name, default=None)");
        return NULL;
    }
    NameSlot *s;
    if (slot_of_key((NameTable *)self, args[0], &s) < 0)
        return NULL;
    if (s != NULL)
        return Py_NewRef(s->atom);
    return Py_NewRef(nargs == 2 ? args[1] : Py_None);
}

static PyObject *
name_table_pop(PyObject *self, PyObject *const *args, Py_ssize_t nargs)
{
    if (nargs < 1 || nargs > 2) {
        PyErr_SetString(PyExc_TypeError, "pop(name[, default])");
        return NULL;
    }
    NameSlot *s;
    if (slot_of_key((NameTable *)self, args[0], &s) < 0)
        return NULL;
    if (s == NULL) {
        if (nargs == 2)
            return Py_NewRef(args[1]);
        PyErr_SetObject(PyExc_KeyError, args[0]);
        return NULL;
    }
    PyObject *atom = Py_NewRef(s->atom);
    remove_slot((NameTable *)self, s);
    return atom;
}

/* clear(): every name forgotten (the pinned ones too, as dict.clear), and the memos. */
static PyObject *
name_table_clear_method(PyObject *self, PyObject *Py_UNUSED(ignored))
{
    NativeState *st = table_state(self);
    if (st == NULL)
        return NULL;
    empty_table((NameTable *)self);
    cbcl_forget_memos(st);
    Py_RETURN_NONE;
}

static PyObject *
name_table_update(PyObject *self, PyObject *mapping)
{
    PyObject *items = PyMapping_Items(mapping);
    if (items == NULL)
        return NULL;
    for (Py_ssize_t k = 0; k < PyList_GET_SIZE(items); k++) {
        PyObject *item = PyList_GET_ITEM(items, k);
        if (!PyTuple_Check(item) || PyTuple_GET_SIZE(item) != 2) {
            Py_DECREF(items);
            PyErr_SetString(PyExc_TypeError, "update: items must be (name, atom) pairs");
            return NULL;
        }
        if (name_table_ass_subscript(self, PyTuple_GET_ITEM(item, 0),
                                     PyTuple_GET_ITEM(item, 1)) < 0) {
            Py_DECREF(items);
            return NULL;
        }
    }
    Py_DECREF(items);
    Py_RETURN_NONE;
}

/* intern(name, pin=False): as cbcl.core._reader._intern over this table. */
static PyObject *
name_table_intern(PyObject *self, PyObject *const *args, Py_ssize_t nargs)
{
    NameTable *t = (NameTable *)self;
    if (nargs < 1 || nargs > 2 || !PyUnicode_CheckExact(args[0])) {
        PyErr_SetString(PyExc_TypeError, "intern(name: str, pin: bool = False, /)");
        return NULL;
    }
    int pin = nargs == 2 ? PyObject_IsTrue(args[1]) : 0;
    if (pin < 0)
        return NULL;
    NativeState *st = table_state(self);
    if (st == NULL)
        return NULL;
    PyObject *name = args[0];
    PyObject *atom = cbcl_names_intern(st, t, name);
    if (atom == NULL || !pin)
        return atom;
    int held = PyDict_Contains(t->pinned, name);
    if (held == 0 && PyDict_GET_SIZE(t->pinned) < t->bound / 2)
        held = PyDict_SetItem(t->pinned, name, atom);
    if (held < 0) {
        Py_DECREF(atom);
        return NULL;
    }
    return atom;
}

static PyObject *
name_table_get_bound(PyObject *self, void *Py_UNUSED(closure))
{
    return PyLong_FromSsize_t(((NameTable *)self)->bound);
}

static PyObject *
name_table_get_pinned(PyObject *self, void *Py_UNUSED(closure))
{
    NameTable *t = (NameTable *)self;
    return Py_NewRef(t->pinned != NULL ? t->pinned : Py_None);
}

static PyObject *
name_table_get_hashes_bytes(PyObject *self, void *Py_UNUSED(closure))
{
    return PyBool_FromLong(((NameTable *)self)->hash_of_bytes);
}

static PyMethodDef name_table_methods[] = {
    {"get", (PyCFunction)(void (*)(void))name_table_get, METH_FASTCALL,
     "get(name, default=None, /): the atom interned as name, or default."},
    {"pop", (PyCFunction)(void (*)(void))name_table_pop, METH_FASTCALL,
     "pop(name[, default], /): the atom interned as name, removed; KeyError if none."},
    {"keys", name_table_keys, METH_NOARGS, "keys(): the names held (a list of str)."},
    {"clear", name_table_clear_method, METH_NOARGS,
     "clear(): every name forgotten (the pinned ones too), and the native memos."},
    {"update", name_table_update, METH_O,
     "update(mapping, /): each (name, atom) entered, as table[name] = atom."},
    {"intern", (PyCFunction)(void (*)(void))name_table_intern, METH_FASTCALL,
     "intern(name, pin=False, /): the atom interned as name (an exact str, a valid name: "
     "not checked), made and entered on a miss (the table emptied down to its pinned "
     "names first when it holds `bound`); pin keeps it through emptyings (at most "
     "bound // 2 pinned)."},
    {NULL, NULL, 0, NULL},
};

static PyGetSetDef name_table_getset[] = {
    {"bound", name_table_get_bound, NULL, "the most atoms held", NULL},
    {"pinned", name_table_get_pinned, NULL, "the dict of pinned names (name -> atom)", NULL},
    {"hashes_bytes", name_table_get_hashes_bytes, NULL,
     "whether names are hashed from their bytes (the check against str's hash held)", NULL},
    {NULL, NULL, NULL, NULL, NULL},
};

static PyType_Slot name_table_slots[] = {
    {Py_tp_doc, "NameTable(which, bound, pinned): an intern table of symbols (which=0) or "
                "keywords (which=1) by name, at most bound of them (cbcl/_native_src/intern.c)."},
    {Py_tp_new, name_table_new},
    {Py_tp_dealloc, name_table_dealloc},
    {Py_tp_traverse, name_table_traverse},
    {Py_tp_clear, name_table_clear},
    {Py_tp_iter, name_table_iter},
    {Py_tp_methods, name_table_methods},
    {Py_tp_getset, name_table_getset},
    {Py_mp_length, name_table_length},
    {Py_mp_subscript, name_table_subscript},
    {Py_mp_ass_subscript, name_table_ass_subscript},
    {Py_sq_contains, name_table_contains},
    {0, NULL},
};

static PyType_Spec name_table_spec = {
    .name = "cbcl._native.NameTable",
    .basicsize = sizeof(NameTable),
    .flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_HAVE_GC | Py_TPFLAGS_IMMUTABLETYPE,
    .slots = name_table_slots,
};

int
cbcl_intern_exec(PyObject *module)
{
    PyObject *type = PyType_FromModuleAndSpec(module, &name_table_spec, NULL);
    if (type == NULL)
        return -1;
    int r = PyModule_AddObjectRef(module, "NameTable", type);
    Py_DECREF(type);
    return r;
}
