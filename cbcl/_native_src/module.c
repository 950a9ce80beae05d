/* cbcl._native: the one optional C extension of cbcl (issue 28).
 *
 * Theory of operation
 * -------------------
 * One module, several translation units (listed together in pyproject.toml's one
 * ext-module; native.h declares what they share): scanner.c (the text reader's fast
 * tiers), speedups.c (the binary decoder, pass 2's walk, the envelope, the schema's fast
 * pass, the decode and parse entries) and encoders.c (the canonical text and binary frame
 * writers), with the headers cstack.h (the readers' value stack, the value types,
 * Decimals made in place, the atom memo) and entry.h (C entry points with a Python
 * fallback). The parse entry calls the scanner's reader directly (no capsule).
 *
 * Initialisation is multi-phase (PEP 489): PyInit__native returns the definition,
 * PyModuleDef_Init; the import system creates the module, with its state, and runs
 * native_exec, which makes the module's heap types (MethodEntry, MessageFields and
 * SignatureFields, below; speedups.c's FrameState, encoders.c's EncoderFields), adds each
 * section's functions and runs each section's set-up (interned strings, the value types of cbcl.core._values and decimal, the Decimal layout check,
 * the entries' definitions).
 *
 * State. Everything the module keeps between calls is its module state, NativeState
 * (native.h: PyModuleDef.m_size; one part per section), never a process-wide variable:
 * the heap types, interned strings, value types and the outcome of the Decimal layout
 * check, the token and atom memos, what setup(), setup_message(), setup_frame() and the
 * *_entry functions are given, the member descriptors found on the classes, and the
 * entries themselves (CEntry: a copy of a static const template; a builtin function's
 * PyMethodDef points into the state, and the function keeps it alive through its self,
 * the module; a MethodEntry through its type, whose module it is). What stays static is
 * constant: const tables, string literals, and the definitions the C API takes (method,
 * member and slot tables, the type specs, this module's definition). Module functions
 * find the state with PyModule_GetState(self) (native_state, native.h, which also raises
 * RuntimeError once it is cleared), a MethodEntry keeps its type's (its module's state,
 * which lives while the type keeps the module alive); the functions they call are handed it (`st`, or a section's part of it). The
 * module's m_traverse visits every reference the state holds and m_clear (m_free too)
 * releases them, each section's part by its own functions: the state is in reference
 * cycles (module -> state -> FrameState type -> module; module -> state -> an entry's
 * fallback -> its module's globals -> the class -> its MethodEntry -> module) that the
 * cyclic collector can thus break. A second module object (another interpreter's
 * import, or importlib's module_from_spec) has a state of its own, set up by its own
 * Python side.
 *
 * The interface with the Python side is made of named things only: C types with named
 * fields (FrameState, made by keyword; MessageFields and SignatureFields, below, the
 * storage the Message and Signature dataclasses are made over, whose structs the writers
 * read and the decoders fill; encoders.c's EncoderFields, what the Encoder's entry
 * reads), public callables, and the member descriptors of the slots the Decoder's entry
 * reads, found on its class by name and used through tp_descr_get (entry.h). No private CPython API is used (no _Py* name;
 * one exception, intern.c's _Py_HashBytes before 3.14, str's hash of a name's bytes, checked against hash(str) where used),
 * no offset is read from a descriptor, and nothing is set on a Python class or module:
 * the entries are bound by the Python definitions themselves (entry.h).
 *
 * Interpreters and the GIL. With all its state in the module object, the module supports
 * several interpreters, each with a GIL of its own (Py_mod_multiple_interpreters:
 * Py_MOD_PER_INTERPRETER_GIL_SUPPORTED): each interpreter's import makes a module object
 * of its own, whose state that interpreter's cbcl sets up (its setup calls, and its class
 * bodies, which bind their entries through cbcl.core._entries from that module), so no
 * object passes between interpreters; what they share is constant (the static data
 * above, this module's definition). tests/test_native_state.py imports it in an isolated
 * subinterpreter beside the main one, and runs all of cbcl in a legacy one. (cbcl as a
 * whole needs the cryptography package, whose Rust extension loads in one interpreter of
 * a process, the first to import it, and in no isolated one: that limit is cbcl's, not
 * this module's.) On free-threaded builds it declares that it needs the GIL (Py_mod_gil:
 * Py_MOD_GIL_USED): the memos are read and written without locks, and the walks borrow
 * items of tuples and dicts that only the GIL keeps from changing under them.
 */
#include "native.h"
#include "intern.h"

/* ------------------------------------------------------------------------- MethodEntry */

/* cbcl._native.MethodEntry: a method entry (entry.h), the object a class body binds where
 * the extension is built (cbcl.core._entries.entry: `@entry(...) def encode(self, ...)`),
 * so the class is made with it and nothing is set on the class afterwards. It is a method
 * descriptor of its own (Py_TPFLAGS_METHOD_DESCRIPTOR: `obj.encode(x)` calls it with obj
 * first, no bound method made; `obj.encode` alone is a bound method), callable by
 * vectorcall. When the class is made, __set_name__ tells it the class (its owner: a
 * dataclass(slots=True) is made twice, and the last class is the one kept), whose
 * instances alone it accepts as self, and runs the entry's bind, which finds the slots
 * the entry reads. __wrapped__ is the Python method, whose signature inspect.signature
 * shows; __doc__ is its docstring. */
typedef struct {
    PyObject_HEAD
    vectorcallfunc vectorcall;
    CEntry *entry;      /* in the state of its type's module: its definition and fallback */
    PyObject *owner;    /* the class, strong; NULL until __set_name__ */
    NativeState *state; /* its type's module's (PyType_GetModuleState, kept: it lives as
                         * long as the module, which the type keeps alive) */
} MethodEntry;

/* The state of a MethodEntry's module (its type's: a MethodEntry keeps its type, which
 * keeps the module), or NULL with RuntimeError once cleared. */
static inline NativeState *
method_entry_state(PyObject *self)
{
    NativeState *st = ((MethodEntry *)self)->state;
    if (st != NULL && st->ready)
        return st;
    if (!PyErr_Occurred())
        PyErr_SetString(PyExc_RuntimeError, "cbcl._native's state is cleared");
    return NULL;
}

static PyObject *
method_entry_vectorcall(PyObject *callable, PyObject *const *args, size_t nargsf,
                        PyObject *kwnames)
{
    MethodEntry *m = (MethodEntry *)callable;
    NativeState *st = method_entry_state(callable);
    if (st == NULL)
        return NULL;
    CEntry *e = m->entry;
    Py_ssize_t nargs = PyVectorcall_NARGS(nargsf);
    PyTypeObject *owner = (PyTypeObject *)m->owner;
    if (owner == NULL) { /* (not in a class: the Python function, as it is) */
        PyObject *fallback = entry_fallback(e);
        return fallback == NULL ? NULL : PyObject_Vectorcall(fallback, args, nargsf, kwnames);
    }
    if (nargs < 1) {
        PyErr_Format(PyExc_TypeError, "unbound method %s.%s() needs an argument",
                     owner->tp_name, e->def.ml_name);
        return NULL;
    }
    PyObject *self = args[0];
    if (!PyObject_TypeCheck(self, owner)) {
        PyErr_Format(PyExc_TypeError,
                     "descriptor '%s' for '%s' objects doesn't apply to a '%s' object",
                     e->def.ml_name, owner->tp_name, Py_TYPE(self)->tp_name);
        return NULL;
    }
    if (e->def.ml_flags & METH_NOARGS) {
        Py_ssize_t given = nargs - 1 + (kwnames == NULL ? 0 : PyTuple_GET_SIZE(kwnames));
        if (given != 0) {
            PyErr_Format(PyExc_TypeError, "%s.%s() takes no arguments (%zd given)",
                         owner->tp_name, e->def.ml_name, given);
            return NULL;
        }
        return e->method(st, self, args + 1, 0, NULL);
    }
    return e->method(st, self, args + 1, nargs - 1, kwnames);
}

static PyObject *
method_entry_get(PyObject *self, PyObject *instance, PyObject *Py_UNUSED(type))
{
    if (instance == NULL || instance == Py_None)
        return Py_NewRef(self);
    return PyMethod_New(self, instance);
}

static PyObject *
method_entry_set_name(PyObject *self, PyObject *args)
{
    MethodEntry *m = (MethodEntry *)self;
    PyObject *owner, *name;
    if (!PyArg_ParseTuple(args, "O!U:__set_name__", &PyType_Type, &owner, &name))
        return NULL;
    NativeState *st = method_entry_state(self);
    if (st == NULL)
        return NULL;
    Py_XSETREF(m->owner, Py_NewRef(owner));
    if (m->entry->bind != NULL && m->entry->bind(st, (PyTypeObject *)owner) < 0)
        return NULL;
    Py_RETURN_NONE;
}

static PyObject *
method_entry_name(PyObject *self, void *Py_UNUSED(closure))
{
    return PyUnicode_FromString(((MethodEntry *)self)->entry->def.ml_name);
}

/* __qualname__, __doc__, __module__ and __wrapped__: the Python method's */
static PyObject *
method_entry_fallback_attribute(PyObject *self, void *closure)
{
    PyObject *fallback = entry_fallback(((MethodEntry *)self)->entry);
    if (fallback == NULL)
        return NULL;
    if (closure == NULL)
        return Py_NewRef(fallback);
    return PyObject_GetAttrString(fallback, (const char *)closure);
}

static PyObject *
method_entry_objclass(PyObject *self, void *Py_UNUSED(closure))
{
    PyObject *owner = ((MethodEntry *)self)->owner;
    return Py_NewRef(owner == NULL ? Py_None : owner);
}

static PyObject *
method_entry_repr(PyObject *self)
{
    MethodEntry *m = (MethodEntry *)self;
    return PyUnicode_FromFormat("<method entry '%s' of '%s' objects>", m->entry->def.ml_name,
                                m->owner == NULL ? "?" : ((PyTypeObject *)m->owner)->tp_name);
}

static int
method_entry_traverse(PyObject *self, visitproc visit, void *arg)
{
    Py_VISIT(Py_TYPE(self));
    Py_VISIT(((MethodEntry *)self)->owner);
    return 0;
}

static int
method_entry_clear(PyObject *self)
{
    Py_CLEAR(((MethodEntry *)self)->owner);
    return 0;
}

static void
method_entry_dealloc(PyObject *self)
{
    PyTypeObject *type = Py_TYPE(self);
    PyObject_GC_UnTrack(self);
    method_entry_clear(self);
    type->tp_free(self);
    Py_DECREF(type);
}

static PyMethodDef method_entry_methods[] = {
    {"__set_name__", method_entry_set_name, METH_VARARGS,
     "__set_name__(owner, name): the class that binds this entry, whose instances it takes "
     "as self and whose slots it reads."},
    {NULL, NULL, 0, NULL},
};

static PyGetSetDef method_entry_getset[] = {
    {"__name__", method_entry_name, NULL, "the method's name", NULL},
    {"__qualname__", method_entry_fallback_attribute, NULL, "the Python method's",
     "__qualname__"},
    {"__doc__", method_entry_fallback_attribute, NULL, "the Python method's", "__doc__"},
    {"__module__", method_entry_fallback_attribute, NULL, "the Python method's",
     "__module__"},
    {"__wrapped__", method_entry_fallback_attribute, NULL,
     "the Python method this entry stands in for (its fallback)", NULL},
    {"__objclass__", method_entry_objclass, NULL, "the class that binds it (None: none yet)",
     NULL},
    {NULL, NULL, NULL, NULL, NULL},
};

static PyMemberDef method_entry_members[] = {
    {"__vectorcalloffset__", Py_T_PYSSIZET, offsetof(MethodEntry, vectorcall), Py_READONLY,
     NULL},
    {NULL, 0, 0, 0, NULL},
};

static PyType_Slot method_entry_slots[] = {
    {Py_tp_call, PyVectorcall_Call},
    {Py_tp_descr_get, method_entry_get},
    {Py_tp_repr, method_entry_repr},
    {Py_tp_traverse, method_entry_traverse},
    {Py_tp_clear, method_entry_clear},
    {Py_tp_dealloc, method_entry_dealloc},
    {Py_tp_methods, method_entry_methods},
    {Py_tp_getset, method_entry_getset},
    {Py_tp_members, method_entry_members},
    {0, NULL},
};

static PyType_Spec method_entry_spec = {
    .name = "cbcl._native.MethodEntry",
    .basicsize = sizeof(MethodEntry),
    .flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_HAVE_GC | Py_TPFLAGS_IMMUTABLETYPE |
             Py_TPFLAGS_HAVE_VECTORCALL | Py_TPFLAGS_METHOD_DESCRIPTOR |
             Py_TPFLAGS_DISALLOW_INSTANTIATION,
    .slots = method_entry_slots,
};

PyObject *
cbcl_method_entry(NativeState *st, CEntry *e)
{
    PyTypeObject *type = st->method_entry_type;
    if (type == NULL || e->fallback == NULL || e->method == NULL) {
        PyErr_SetString(PyExc_RuntimeError, "a method entry needs the module and a fallback");
        return NULL;
    }
    /* (zeroed, tracked, and holding its heap type) */
    MethodEntry *m = (MethodEntry *)type->tp_alloc(type, 0);
    if (m == NULL)
        return NULL;
    m->vectorcall = method_entry_vectorcall;
    m->entry = e;
    m->state = st; /* (the state of type's module: type is st->method_entry_type) */
    return (PyObject *)m;
}

/* ------------------------------------------------------------------------- MessageFields */

/* cbcl._native.MessageFields and SignatureFields (native.h's structs): base classes that
 * hold a message's and a signature's fields as named members, writable (the dataclasses
 * over them write their fields with object.__setattr__, past their frozen __setattr__, as
 * they would write slots), GC-tracked, with no __dict__ and no weak references (as a
 * dataclass(slots=True) has neither). Subclassable, and made without arguments: the
 * subclass's __init__ (the dataclass's) takes them. Their tp_new is object's, so that
 * object.__new__(Message) stays valid (Message._trusted's Python path, copy, pickle). */

#define MESSAGE_MEMBER(name, doc) \
    {#name, Py_T_OBJECT_EX, offsetof(MessageFieldsObject, name), 0, doc},

static PyMemberDef message_fields_members[] = {
    MESSAGE_MEMBER(message_id, NULL)
    MESSAGE_MEMBER(sender, NULL)
    MESSAGE_MEMBER(receiver, NULL)
    MESSAGE_MEMBER(intent, NULL)
    MESSAGE_MEMBER(protocol, NULL)
    MESSAGE_MEMBER(conversation_id, NULL)
    MESSAGE_MEMBER(in_reply_to, NULL)
    MESSAGE_MEMBER(reply_by, NULL)
    MESSAGE_MEMBER(timestamp, NULL)
    MESSAGE_MEMBER(trace, NULL)
    MESSAGE_MEMBER(body, NULL)
    MESSAGE_MEMBER(signature, NULL)
    {NULL, 0, 0, 0, NULL},
};
static_assert(sizeof(message_fields_members) / sizeof(PyMemberDef) ==
              CBCL_MESSAGE_FIELDS + 1, "one member per field");

static int
message_fields_traverse(PyObject *self, visitproc visit, void *arg)
{
    MessageFieldsObject *m = (MessageFieldsObject *)self;
    Py_VISIT(Py_TYPE(self));
    Py_VISIT(m->message_id);
    Py_VISIT(m->sender);
    Py_VISIT(m->receiver);
    Py_VISIT(m->intent);
    Py_VISIT(m->protocol);
    Py_VISIT(m->conversation_id);
    Py_VISIT(m->in_reply_to);
    Py_VISIT(m->reply_by);
    Py_VISIT(m->timestamp);
    Py_VISIT(m->trace);
    Py_VISIT(m->body);
    Py_VISIT(m->signature);
    return 0;
}

static int
message_fields_clear(PyObject *self)
{
    MessageFieldsObject *m = (MessageFieldsObject *)self;
    Py_CLEAR(m->message_id);
    Py_CLEAR(m->sender);
    Py_CLEAR(m->receiver);
    Py_CLEAR(m->intent);
    Py_CLEAR(m->protocol);
    Py_CLEAR(m->conversation_id);
    Py_CLEAR(m->in_reply_to);
    Py_CLEAR(m->reply_by);
    Py_CLEAR(m->timestamp);
    Py_CLEAR(m->trace);
    Py_CLEAR(m->body);
    Py_CLEAR(m->signature);
    return 0;
}

/* (a subclass's instance comes here through subtype_dealloc, which leaves the type's
 * reference to the first heap type's dealloc: this one) */
static void
message_fields_dealloc(PyObject *self)
{
    PyTypeObject *type = Py_TYPE(self);
    PyObject_GC_UnTrack(self);
    message_fields_clear(self);
    type->tp_free(self);
    Py_DECREF(type);
}

static PyType_Slot message_fields_slots[] = {
    {Py_tp_doc, "The storage of cbcl.protocol._message.Message: its fields as named members "
                "(cbcl/_native_src/native.h)."},
    {Py_tp_traverse, message_fields_traverse},
    {Py_tp_clear, message_fields_clear},
    {Py_tp_dealloc, message_fields_dealloc},
    {Py_tp_members, message_fields_members},
    {0, NULL},
};

static PyType_Spec message_fields_spec = {
    .name = "cbcl._native.MessageFields",
    .basicsize = sizeof(MessageFieldsObject),
    .flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_BASETYPE | Py_TPFLAGS_HAVE_GC |
             Py_TPFLAGS_IMMUTABLETYPE,
    .slots = message_fields_slots,
};

static PyMemberDef signature_fields_members[] = {
    {"key_id", Py_T_OBJECT_EX, offsetof(SignatureFieldsObject, key_id), 0, NULL},
    {"value", Py_T_OBJECT_EX, offsetof(SignatureFieldsObject, value), 0, NULL},
    {NULL, 0, 0, 0, NULL},
};

static int
signature_fields_traverse(PyObject *self, visitproc visit, void *arg)
{
    Py_VISIT(Py_TYPE(self));
    Py_VISIT(((SignatureFieldsObject *)self)->key_id);
    Py_VISIT(((SignatureFieldsObject *)self)->value);
    return 0;
}

static int
signature_fields_clear(PyObject *self)
{
    Py_CLEAR(((SignatureFieldsObject *)self)->key_id);
    Py_CLEAR(((SignatureFieldsObject *)self)->value);
    return 0;
}

static void
signature_fields_dealloc(PyObject *self)
{
    PyTypeObject *type = Py_TYPE(self);
    PyObject_GC_UnTrack(self);
    signature_fields_clear(self);
    type->tp_free(self);
    Py_DECREF(type);
}

static PyType_Slot signature_fields_slots[] = {
    {Py_tp_doc, "The storage of cbcl.protocol._message.Signature: its two fields as named "
                "members (cbcl/_native_src/native.h)."},
    {Py_tp_traverse, signature_fields_traverse},
    {Py_tp_clear, signature_fields_clear},
    {Py_tp_dealloc, signature_fields_dealloc},
    {Py_tp_members, signature_fields_members},
    {0, NULL},
};

static PyType_Spec signature_fields_spec = {
    .name = "cbcl._native.SignatureFields",
    .basicsize = sizeof(SignatureFieldsObject),
    .flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_BASETYPE | Py_TPFLAGS_HAVE_GC |
             Py_TPFLAGS_IMMUTABLETYPE,
    .slots = signature_fields_slots,
};

PyObject *
cbcl_message_new(PyTypeObject *type, PyObject *const *values)
{
    /* (zeroed, tracked, and holding its heap type) */
    MessageFieldsObject *m = (MessageFieldsObject *)type->tp_alloc(type, 0);
    if (m == NULL)
        return NULL;
    PyObject **const f[CBCL_MESSAGE_FIELDS] = {
        &m->message_id, &m->sender, &m->receiver, &m->intent, &m->protocol,
        &m->conversation_id, &m->in_reply_to, &m->reply_by, &m->timestamp, &m->trace,
        &m->body, &m->signature};
    for (int i = 0; i < CBCL_MESSAGE_FIELDS; i++)
        *f[i] = Py_NewRef(values[i] != NULL ? values[i] : Py_None);
    return (PyObject *)m;
}

PyObject *
cbcl_signature_new(PyTypeObject *type, PyObject *key_id, PyObject *value)
{
    SignatureFieldsObject *s = (SignatureFieldsObject *)type->tp_alloc(type, 0);
    if (s == NULL)
        return NULL;
    s->key_id = Py_NewRef(key_id);
    s->value = Py_NewRef(value);
    return (PyObject *)s;
}

/* ------------------------------------------------------------------------- the module */

/* decimals_in_place() -> bool: whether the readers make decimals in place (the layout
 * check of cstack.h held: st->values), for the tests. */
static PyObject *
decimals_in_place(PyObject *module, PyObject *Py_UNUSED(ignored))
{
    NativeState *st = native_state(module);
    return st == NULL ? NULL : PyBool_FromLong(st->values.in_place);
}

static PyMethodDef native_methods[] = {
    {"decimals_in_place", decimals_in_place, METH_NOARGS,
     "decimals_in_place() -> bool: whether this module makes Decimals in place "
     "(cbcl/_native_src/cstack.h's layout check held), else by Decimal(text)."},
    {NULL, NULL, 0, NULL},
};

/* records.c's set-up: its RecordConverter type, added to the module (no state). */
CBCL_INTERNAL int cbcl_records_exec(PyObject *module);

static int
native_exec(PyObject *module)
{
    NativeState *st = (NativeState *)PyModule_GetState(module);
    if (st == NULL)
        return -1;
    PyObject *type = PyType_FromModuleAndSpec(module, &method_entry_spec, NULL);
    if (type == NULL)
        return -1;
    st->method_entry_type = (PyTypeObject *)type; /* (strong: the state's) */
    if (PyModule_AddObjectRef(module, "MethodEntry", type) < 0)
        return -1;
    type = PyType_FromModuleAndSpec(module, &message_fields_spec, NULL);
    if (type == NULL)
        return -1;
    st->message_fields_type = (PyTypeObject *)type;
    if (PyModule_AddObjectRef(module, "MessageFields", type) < 0)
        return -1;
    type = PyType_FromModuleAndSpec(module, &signature_fields_spec, NULL);
    if (type == NULL)
        return -1;
    st->signature_fields_type = (PyTypeObject *)type;
    if (PyModule_AddObjectRef(module, "SignatureFields", type) < 0)
        return -1;
    if (PyModule_AddFunctions(module, native_methods) < 0 ||
        PyModule_AddFunctions(module, cbcl_scanner_methods) < 0 ||
        PyModule_AddFunctions(module, cbcl_speedups_methods) < 0 ||
        PyModule_AddFunctions(module, cbcl_encoders_methods) < 0 ||
        PyModule_AddFunctions(module, cbcl_outgoing_methods) < 0)
        return -1;
    if (cbcl_intern_exec(module) < 0) /* (before the scanner's, which imports the tables' module) */
        return -1;
    if (cbcl_scanner_exec(module, st) < 0 || cbcl_speedups_exec(module, st) < 0 ||
            cbcl_encoders_exec(module, st) < 0 || cbcl_session_exec(module, st) < 0 ||
            cbcl_records_exec(module) < 0 || cbcl_outgoing_exec(module, st) < 0)
        return -1;
    st->ready = 1;
    return 0;
}

static int
native_traverse(PyObject *module, visitproc visit, void *arg)
{
    NativeState *st = (NativeState *)PyModule_GetState(module);
    if (st == NULL)
        return 0;
    Py_VISIT(st->method_entry_type);
    Py_VISIT(st->message_fields_type);
    Py_VISIT(st->signature_fields_type);
    int r;
    if ((r = cbcl_scanner_traverse(st, visit, arg)) != 0 ||
            (r = cbcl_speedups_traverse(st, visit, arg)) != 0 ||
            (r = cbcl_encoders_traverse(st, visit, arg)) != 0 ||
            (r = cbcl_outgoing_traverse(st, visit, arg)) != 0)
        return r;
    return 0;
}

static int
native_clear(PyObject *module)
{
    NativeState *st = (NativeState *)PyModule_GetState(module);
    if (st == NULL)
        return 0;
    st->ready = 0; /* (from now on every function raises RuntimeError) */
    cbcl_outgoing_clear(st);
    cbcl_encoders_clear(st);
    cbcl_speedups_clear(st);
    cbcl_scanner_clear(st);
    Py_CLEAR(st->method_entry_type);
    Py_CLEAR(st->message_fields_type);
    Py_CLEAR(st->signature_fields_type);
    return 0;
}

static void
native_free(void *module)
{
    native_clear((PyObject *)module);
}

static PyModuleDef_Slot native_slots[] = {
    {Py_mod_exec, native_exec},
#if PY_VERSION_HEX >= 0x030C0000
    /* all its state is the module object's (see above): a module per interpreter, each
     * under that interpreter's own GIL */
    {Py_mod_multiple_interpreters, Py_MOD_PER_INTERPRETER_GIL_SUPPORTED},
#endif
#if PY_VERSION_HEX >= 0x030D0000
    /* unlocked memos and borrowed items (see above): the GIL is needed */
    {Py_mod_gil, Py_MOD_GIL_USED},
#endif
    {0, NULL},
};

static struct PyModuleDef native_module = {
    PyModuleDef_HEAD_INIT,
    .m_name = "cbcl._native",
    .m_doc = "Optional C twins of cbcl's readers, decoders and encoders (cbcl/_native_src/).",
    .m_size = sizeof(NativeState),
    .m_methods = NULL,
    .m_slots = native_slots,
    .m_traverse = native_traverse,
    .m_clear = native_clear,
    .m_free = native_free,
};

PyMODINIT_FUNC
PyInit__native(void)
{
    return PyModuleDef_Init(&native_module);
}
