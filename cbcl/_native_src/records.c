/* cbcl._native.RecordConverter: a typed record's body converted into its class in C (the
 * twin of the `_from_body` cbcl/protocol/_records.py writes for a cbcl.Record class, and
 * of record_of's ordinary case).
 *
 * Theory of operation
 * -------------------
 * A converter is made once per record class, when the class is made (_records.py's
 * _native_converter), from a *plan*: the class, the member descriptor of its body slot
 * (__cbcl_body__), the index of the body's first key (after the heads), and for each
 * member, in declared order, a tuple (keyword, member descriptor of its slot, required,
 * default, kind, argument, Python converter). The kind says how the wire value becomes
 * the stored one:
 *
 *   RAW           stored as it is (str, int, Decimal, Symbol/Keyword/URI, a list of them
 *                 as a tuple, any Value)
 *   LOOKUP        a Literal: the dict `argument` maps the wire value (a Symbol, an int) to
 *                 the Python one (its symbols the reader's interned ones, so a decoded
 *                 value is found by identity); a miss calls the Python converter
 *   RECORD        a nested record: `argument` is its class's converter
 *   RECORDS_TUPLE / RECORDS_LIST  a list of nested records (`argument`, their converter),
 *                 made a tuple or a list
 *   LIST          list(value)
 *   BOOL          `argument` is the interned symbols (true, false) (identity: True,
 *                 False), else the Python converter decides
 *   CALL          the Python converter (a datetime, anything rarer)
 *
 * Calling the converter with a body does what `_from_body` does: an instance made by
 * the class's tp_alloc (what object.__new__ does for a class that defines no __new__: the
 * plan is refused otherwise), each member taken in declared order while the body's keys
 * come in that order and are the interned keywords (compared by identity), else every key
 * found in a dict of the body's pairs (the last of a repeated key, as dict() keeps it), an
 * absent optional member its default; each slot is filled through its member
 * descriptor's tp_descr_set (the descriptor protocol, as setattr on the slot would, past
 * the class's __setattr__ that makes records immutable: no offset is read, no private
 * API used), and last the body slot with the body itself.
 *
 * `of(message, protocol)` is record_of's ordinary case in one call: a Message (over
 * MessageFields) whose body has the class's one head, an intent the class declares, and
 * a protocol the converter has been told to trust (`trust(protocol)`: its schema's record
 * equals the class's, so the body is checked already; _records.py decides that). Anything
 * else returns None, as does a conversion the Python converter refuses (ValueError), and
 * the caller runs the Python reference, which raises its typed errors.
 */
#include "native.h"

enum {
    K_RAW = 0, K_LOOKUP, K_RECORD, K_RECORDS_TUPLE, K_RECORDS_LIST, K_LIST, K_BOOL, K_CALL,
    K_COUNT
};
enum { F_KEY = 0, F_DESCR, F_REQUIRED, F_DEFAULT, F_KIND, F_ARG, F_CONVERT, F_SIZE };

typedef struct {
    PyObject *key, *descr, *deflt, *arg, *convert; /* borrowed from the plan's tuples */
    int required, kind;
} MemberPlan;

typedef struct {
    PyObject_HEAD
    PyTypeObject *cls;      /* strong */
    PyObject *body_descr;   /* strong: the __cbcl_body__ member descriptor */
    PyObject *members;      /* strong: the tuple of member tuples (MemberPlan borrows) */
    PyObject *heads;        /* strong: the class's heads (a tuple of Symbols) */
    PyObject *intents;      /* strong: the class's intents (a tuple; empty: any) */
    PyObject *trusted;      /* strong or NULL: the protocol of(…) trusts */
    Py_ssize_t start, count;
    MemberPlan *plan;       /* PyMem: count entries */
} ConverterObject;

static int
is_member_descriptor(PyObject *d)
{
    return PyObject_TypeCheck(d, &PyMemberDescr_Type) && Py_TYPE(d)->tp_descr_set != NULL;
}

static PyObject *convert_body(ConverterObject *c, PyObject *body);

/* The stored value of wire value v for member m: a new reference, or NULL. */
static PyObject *
convert_member(const MemberPlan *m, PyObject *v)
{
    switch (m->kind) {
    case K_RAW:
        return Py_NewRef(v);
    case K_LOOKUP: {
        PyObject *found = PyDict_GetItemWithError(m->arg, v);
        if (found != NULL)
            return Py_NewRef(found);
        if (PyErr_Occurred())
            return NULL;
        return PyObject_CallOneArg(m->convert, v);
    }
    case K_RECORD:
        return convert_body((ConverterObject *)m->arg, v);
    case K_RECORDS_TUPLE:
    case K_RECORDS_LIST: {
        if (!PyTuple_Check(v) && !PyList_Check(v))
            return PyObject_CallOneArg(m->convert, v);
        PyObject *seq = PySequence_Fast(v, "a list"); /* (v itself: a tuple or list) */
        if (seq == NULL)
            return NULL;
        Py_ssize_t n = PySequence_Fast_GET_SIZE(seq);
        PyObject *out = m->kind == K_RECORDS_TUPLE ? PyTuple_New(n) : PyList_New(n);
        if (out == NULL) {
            Py_DECREF(seq);
            return NULL;
        }
        for (Py_ssize_t i = 0; i < n; i++) {
            PyObject *item = convert_body((ConverterObject *)m->arg,
                                          PySequence_Fast_GET_ITEM(seq, i));
            if (item == NULL) {
                Py_DECREF(seq);
                Py_DECREF(out);
                return NULL;
            }
            if (m->kind == K_RECORDS_TUPLE)
                PyTuple_SET_ITEM(out, i, item);
            else
                PyList_SET_ITEM(out, i, item);
        }
        Py_DECREF(seq);
        return out;
    }
    case K_LIST:
        return PySequence_List(v);
    case K_BOOL:
        if (v == PyTuple_GET_ITEM(m->arg, 0))
            return Py_NewRef(Py_True);
        if (v == PyTuple_GET_ITEM(m->arg, 1))
            return Py_NewRef(Py_False);
        return PyObject_CallOneArg(m->convert, v);
    default: /* K_CALL */
        return PyObject_CallOneArg(m->convert, v);
    }
}

/* Set slot `descr` of `self` to `value` (a new reference, stolen; NULL: an error already
 * set): 0, or -1 with an exception. */
static int
set_slot(PyObject *self, PyObject *descr, PyObject *value)
{
    if (value == NULL)
        return -1;
    int r = Py_TYPE(descr)->tp_descr_set(descr, self, value);
    Py_DECREF(value);
    return r;
}

/* The body's pairs from c->start as a dict (the last of a repeated key kept). */
static PyObject *
pairs_dict(ConverterObject *c, PyObject *body)
{
    PyObject *d = PyDict_New();
    if (d == NULL)
        return NULL;
    Py_ssize_t n = PyTuple_GET_SIZE(body);
    for (Py_ssize_t i = c->start; i + 1 < n; i += 2)
        if (PyDict_SetItem(d, PyTuple_GET_ITEM(body, i), PyTuple_GET_ITEM(body, i + 1)) < 0) {
            Py_DECREF(d);
            return NULL;
        }
    return d;
}

static PyObject *
convert_body(ConverterObject *c, PyObject *body)
{
    if (!PyTuple_Check(body)) {
        PyErr_Format(PyExc_TypeError, "a %s body is a tuple, not %.80s", c->cls->tp_name,
                     Py_TYPE(body)->tp_name);
        return NULL;
    }
    if (c->cls == NULL) {
        PyErr_SetString(PyExc_RuntimeError, "a cleared RecordConverter");
        return NULL;
    }
    PyObject *self = c->cls->tp_alloc(c->cls, 0);
    if (self == NULL)
        return NULL;
    Py_ssize_t n = PyTuple_GET_SIZE(body), i = c->start, f = 0;
    for (; f < c->count; f++) { /* in declared order */
        const MemberPlan *m = &c->plan[f];
        if (i + 1 < n && PyTuple_GET_ITEM(body, i) == m->key) {
            if (set_slot(self, m->descr, convert_member(m, PyTuple_GET_ITEM(body, i + 1))) < 0)
                goto error;
            i += 2;
        }
        else if (m->required)
            break;
        else if (set_slot(self, m->descr, Py_NewRef(m->deflt)) < 0)
            goto error;
    }
    /* (i + 1 < n above: an odd last item is left over, as _from_body's `_i != _n`) */
    if (f < c->count || i != n) { /* by a dict of the pairs */
        PyObject *d = pairs_dict(c, body);
        if (d == NULL)
            goto error;
        for (f = 0; f < c->count; f++) {
            const MemberPlan *m = &c->plan[f];
            PyObject *v = PyDict_GetItemWithError(d, m->key); /* borrowed */
            if (v == NULL && PyErr_Occurred()) {
                Py_DECREF(d);
                goto error;
            }
            if (v == NULL && m->required) {
                PyErr_SetObject(PyExc_KeyError, m->key);
                Py_DECREF(d);
                goto error;
            }
            if (set_slot(self, m->descr, v == NULL ? Py_NewRef(m->deflt)
                                                   : convert_member(m, v)) < 0) {
                Py_DECREF(d);
                goto error;
            }
        }
        Py_DECREF(d);
    }
    if (set_slot(self, c->body_descr, Py_NewRef(body)) < 0)
        goto error;
    return self;
error:
    Py_DECREF(self);
    return NULL;
}

/* RecordConverter(cls, body_descr, start, members, heads, intents) */
static PyObject *
converter_new(PyTypeObject *type, PyObject *args, PyObject *kwargs)
{
    PyObject *cls, *body_descr, *members, *heads, *intents;
    Py_ssize_t start;
    if (kwargs != NULL && PyDict_GET_SIZE(kwargs) != 0) {
        PyErr_SetString(PyExc_TypeError, "RecordConverter takes positional arguments");
        return NULL;
    }
    if (!PyArg_ParseTuple(args, "O!OnO!O!O!:RecordConverter", &PyType_Type, &cls, &body_descr,
                          &start, &PyTuple_Type, &members, &PyTuple_Type, &heads,
                          &PyTuple_Type, &intents))
        return NULL;
    PyTypeObject *t = (PyTypeObject *)cls;
    if (t->tp_new != PyBaseObject_Type.tp_new || t->tp_alloc == NULL) {
        PyErr_SetString(PyExc_TypeError, "a record class makes its instances by object.__new__");
        return NULL;
    }
    if (!is_member_descriptor(body_descr) || start < 0) {
        PyErr_SetString(PyExc_TypeError, "the body slot is a member descriptor");
        return NULL;
    }
    Py_ssize_t count = PyTuple_GET_SIZE(members);
    MemberPlan *plan = PyMem_Calloc((size_t)(count ? count : 1), sizeof(MemberPlan));
    if (plan == NULL)
        return PyErr_NoMemory();
    for (Py_ssize_t f = 0; f < count; f++) {
        PyObject *m = PyTuple_GET_ITEM(members, f);
        if (!PyTuple_CheckExact(m) || PyTuple_GET_SIZE(m) != F_SIZE)
            goto bad;
        MemberPlan *p = &plan[f];
        p->key = PyTuple_GET_ITEM(m, F_KEY);
        p->descr = PyTuple_GET_ITEM(m, F_DESCR);
        p->deflt = PyTuple_GET_ITEM(m, F_DEFAULT);
        p->arg = PyTuple_GET_ITEM(m, F_ARG);
        p->convert = PyTuple_GET_ITEM(m, F_CONVERT);
        p->required = PyObject_IsTrue(PyTuple_GET_ITEM(m, F_REQUIRED));
        long kind = PyLong_AsLong(PyTuple_GET_ITEM(m, F_KIND));
        if (p->required < 0 || (kind == -1 && PyErr_Occurred()))
            goto fail;
        p->kind = (int)kind;
        if (kind < 0 || kind >= K_COUNT || !is_member_descriptor(p->descr))
            goto bad;
        if (kind == K_LOOKUP && !PyDict_CheckExact(p->arg))
            goto bad;
        if (kind == K_BOOL && (!PyTuple_CheckExact(p->arg) || PyTuple_GET_SIZE(p->arg) != 2))
            goto bad;
        if ((kind == K_RECORD || kind == K_RECORDS_TUPLE || kind == K_RECORDS_LIST) &&
                Py_TYPE(p->arg) != type)
            goto bad;
        if ((kind == K_LOOKUP || kind == K_BOOL || kind == K_CALL ||
             kind == K_RECORDS_TUPLE || kind == K_RECORDS_LIST) && !PyCallable_Check(p->convert))
            goto bad;
    }
    ConverterObject *c = (ConverterObject *)type->tp_alloc(type, 0);
    if (c == NULL)
        goto fail;
    c->cls = (PyTypeObject *)Py_NewRef(cls);
    c->body_descr = Py_NewRef(body_descr);
    c->members = Py_NewRef(members);
    c->heads = Py_NewRef(heads);
    c->intents = Py_NewRef(intents);
    c->trusted = NULL;
    c->start = start;
    c->count = count;
    c->plan = plan;
    return (PyObject *)c;
bad:
    PyErr_SetString(PyExc_TypeError, "a member's plan is (keyword, member descriptor, "
                    "required, default, kind, argument, converter)");
fail:
    PyMem_Free(plan);
    return NULL;
}

static int
converter_traverse(PyObject *self, visitproc visit, void *arg)
{
    ConverterObject *c = (ConverterObject *)self;
    Py_VISIT(Py_TYPE(self));
    Py_VISIT(c->cls);
    Py_VISIT(c->body_descr);
    Py_VISIT(c->members);
    Py_VISIT(c->heads);
    Py_VISIT(c->intents);
    Py_VISIT(c->trusted);
    return 0;
}

static int
converter_clear(PyObject *self)
{
    ConverterObject *c = (ConverterObject *)self;
    c->count = 0; /* (the plan borrows from members) */
    Py_CLEAR(c->cls);
    Py_CLEAR(c->body_descr);
    Py_CLEAR(c->members);
    Py_CLEAR(c->heads);
    Py_CLEAR(c->intents);
    Py_CLEAR(c->trusted);
    return 0;
}

static void
converter_dealloc(PyObject *self)
{
    PyTypeObject *type = Py_TYPE(self);
    PyObject_GC_UnTrack(self);
    converter_clear(self);
    PyMem_Free(((ConverterObject *)self)->plan);
    type->tp_free(self);
    Py_DECREF(type);
}

static PyObject *
converter_call(PyObject *self, PyObject *args, PyObject *kwargs)
{
    ConverterObject *c = (ConverterObject *)self;
    if (PyTuple_GET_SIZE(args) != 1 || (kwargs != NULL && PyDict_GET_SIZE(kwargs) != 0)) {
        PyErr_SetString(PyExc_TypeError, "a RecordConverter takes one body");
        return NULL;
    }
    return convert_body(c, PyTuple_GET_ITEM(args, 0));
}

/* record_of's ordinary case for a message (over MessageFields) and the protocol its
 * registry holds for it: the record (a new reference), None where the converter declines
 * (the caller runs the Python reference), or NULL with an exception. */
static PyObject *
of_message(ConverterObject *c, NativeState *st, PyObject *message, PyObject *protocol)
{
    if (st == NULL || !st->ready || st->message_fields_type == NULL || c->cls == NULL ||
            c->trusted == NULL || protocol != c->trusted ||
            !PyObject_TypeCheck(message, st->message_fields_type))
        Py_RETURN_NONE;
    MessageFieldsObject *m = (MessageFieldsObject *)message;
    PyObject *body = m->body;
    if (body == NULL || !PyTuple_CheckExact(body) || PyTuple_GET_SIZE(body) == 0 ||
            PyTuple_GET_SIZE(c->heads) != 1 ||
            PyTuple_GET_ITEM(body, 0) != PyTuple_GET_ITEM(c->heads, 0))
        Py_RETURN_NONE;
    Py_ssize_t k = PyTuple_GET_SIZE(c->intents);
    if (k) {
        Py_ssize_t j = 0;
        while (j < k && PyTuple_GET_ITEM(c->intents, j) != m->intent)
            j++;
        if (j == k)
            Py_RETURN_NONE;
    }
    Py_INCREF(body); /* (held while Python converters run) */
    PyObject *made = convert_body(c, body);
    Py_DECREF(body);
    if (made == NULL && PyErr_ExceptionMatches(PyExc_ValueError)) {
        PyErr_Clear(); /* (the reference raises its SchemaError) */
        Py_RETURN_NONE;
    }
    return made;
}

/* of(message, protocol): see the comment at the top. */
static PyObject *
converter_of(PyObject *self, PyObject *const *args, Py_ssize_t nargs)
{
    if (nargs != 2) {
        PyErr_SetString(PyExc_TypeError, "of(message, protocol)");
        return NULL;
    }
    return of_message((ConverterObject *)self,
                      (NativeState *)PyType_GetModuleState(Py_TYPE(self)), args[0], args[1]);
}

static PyObject *
converter_trust(PyObject *self, PyObject *protocol)
{
    ConverterObject *c = (ConverterObject *)self;
    Py_XSETREF(c->trusted, protocol == Py_None ? NULL : Py_NewRef(protocol));
    Py_RETURN_NONE;
}

static PyMethodDef converter_methods[] = {
    {"of", (PyCFunction)(void (*)(void))converter_of, METH_FASTCALL,
     "of(message, protocol) -> record | None: record_of's ordinary case (the body's one "
     "head, a declared intent, the trusted protocol), else None."},
    {"trust", converter_trust, METH_O,
     "trust(protocol | None): the protocol whose schema holds this class's record."},
    {NULL, NULL, 0, NULL},
};

static PyType_Slot converter_slots[] = {
    {Py_tp_new, converter_new},
    {Py_tp_call, converter_call},
    {Py_tp_traverse, converter_traverse},
    {Py_tp_clear, converter_clear},
    {Py_tp_dealloc, converter_dealloc},
    {Py_tp_methods, converter_methods},
    {Py_tp_doc, "RecordConverter(cls, body_descr, start, members, heads, intents): a "
                "record class's body converter (cbcl/_native_src/records.c)."},
    {0, NULL},
};

static PyType_Spec converter_spec = {
    .name = "cbcl._native.RecordConverter",
    .basicsize = sizeof(ConverterObject),
    .flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_HAVE_GC | Py_TPFLAGS_IMMUTABLETYPE,
    .slots = converter_slots,
};

/* The section's set-up (module.c's native_exec): the type, added to the module. */
CBCL_INTERNAL int cbcl_records_exec(PyObject *module);

int
cbcl_records_exec(PyObject *module)
{
    PyObject *type = PyType_FromModuleAndSpec(module, &converter_spec, NULL);
    if (type == NULL)
        return -1;
    int r = PyModule_AddObjectRef(module, "RecordConverter", type);
    Py_DECREF(type);
    return r;
}

/* speedups.c's Decoder.decode(frame, type=C) and parse(data, registry=R, type=C) in C: the
 * message frame_message or parse_fast made (every check made, as without type=) converted
 * into the record class `type` by its converter (the class's own __cbcl_converter__, not a
 * base's) in the ordinary case record_of's C call takes — the converter trusts the
 * protocol `protocols` (the registry's Registry._protocols_by_id(), the protocols those
 * paths serve, each the object registry.get gives) holds for the message's id, the body
 * has the class's head and an intent it declares — so that no Python frame runs between
 * the frame and the record. Returns the record (a new reference), None where anything
 * else holds (the caller then runs the Python method, whose record_of decides and
 * raises), or NULL with an exception. */
CBCL_INTERNAL PyObject *cbcl_record_of_decoded(NativeState *st, PyObject *type,
                                               PyObject *message, PyObject *protocols);

PyObject *
cbcl_record_of_decoded(NativeState *st, PyObject *type, PyObject *message,
                       PyObject *protocols)
{
    if (!PyType_Check(type) || !PyDict_CheckExact(protocols) || st == NULL ||
            st->speedups.s_cbcl_converter == NULL || st->message_fields_type == NULL ||
            !PyObject_TypeCheck(message, st->message_fields_type) ||
            ((MessageFieldsObject *)message)->protocol == NULL)
        Py_RETURN_NONE;
    /* The converter found last, again, for the same class while neither it nor its
     * metaclass has changed since: their version tags, as CPython's own attribute cache
     * has them (unique to a class; any change to it, a base or the metaclass gives a new
     * tag or none), so the class found then is this one, alive (the caller holds it) and
     * holding that converter still. No reference is kept. */
    SpeedupsState *sp = &st->speedups;
    PyTypeObject *cls = (PyTypeObject *)type, *meta = Py_TYPE(type);
    PyObject *found = sp->record_converter;
    if (found != NULL && sp->record_type == type &&
            (cls->tp_flags & Py_TPFLAGS_VALID_VERSION_TAG) &&
            (meta->tp_flags & Py_TPFLAGS_VALID_VERSION_TAG) &&
            cls->tp_version_tag == sp->record_version &&
            meta->tp_version_tag == sp->record_meta_version) {
        Py_INCREF(found);
    } else {
        found = PyObject_GetAttr(type, sp->s_cbcl_converter);
        if (found == NULL) {
            if (!PyErr_ExceptionMatches(PyExc_AttributeError))
                return NULL;
            PyErr_Clear();
            Py_RETURN_NONE;
        }
        /* (a RecordConverter is known by its dealloc: every type made from converter_spec) */
        if (Py_TYPE(found)->tp_dealloc != converter_dealloc ||
                (PyObject *)((ConverterObject *)found)->cls != type) {
            Py_DECREF(found);
            Py_RETURN_NONE;
        }
        if ((cls->tp_flags & Py_TPFLAGS_VALID_VERSION_TAG) &&
                (meta->tp_flags & Py_TPFLAGS_VALID_VERSION_TAG)) {
            sp->record_type = type;
            sp->record_converter = found;
            sp->record_version = cls->tp_version_tag;
            sp->record_meta_version = meta->tp_version_tag;
        }
    }
    ConverterObject *c = (ConverterObject *)found;
    if (c->trusted == NULL) {
        Py_DECREF(found);
        Py_RETURN_NONE;
    }
    PyObject *protocol = PyDict_GetItemWithError(
        protocols, ((MessageFieldsObject *)message)->protocol); /* borrowed */
    if (protocol == NULL && PyErr_Occurred()) {
        Py_DECREF(found);
        return NULL;
    }
    Py_XINCREF(protocol);
    PyObject *made = of_message(c, st, message, protocol);
    Py_XDECREF(protocol);
    Py_DECREF(found);
    return made;
}
