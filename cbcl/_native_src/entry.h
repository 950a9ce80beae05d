/* Entry points: C functions installed in place of a Python function or method (included by
 * cbcl/_native_src/encoders.c and cbcl/_native_src/speedups.c, static: each unit has its own copy).
 *
 * Theory of operation
 * -------------------
 * A call of a short operation (encoding or decoding one ~370 B message takes 0.4-3 us)
 * pays for the Python frame of its public function or method before any C runs: argument
 * binding, attribute reads, a test per option, the call of the C twin. An entry is the
 * public callable itself, written in C: it serves the ordinary call (the usual arguments,
 * an object in its usual state) with the module's C twins, and hands every other call,
 * unchanged (the same positional and keyword arguments), to the Python function it stands
 * in for, its *fallback*. The fallback stays the reference: the same results and the same
 * exceptions, and where the module is not built it is what the name is bound to.
 *
 * An entry's documentation is its fallback's: cbcl/core/_entries.py makes the text (the Python
 * signature, less annotations, as a __text_signature__, then the docstring) and setup
 * keeps it alive while ml_doc points into it, so help() and inspect.signature() show what
 * they show for the Python function.
 *
 * An entry is made once per module object (so once per interpreter that imports cbcl),
 * from the CEntry in the module's state (native.h: a copy of the section's static const
 * template, made by the module's exec), by the *_entry function its Python definition
 * calls where the extension is built (the decorator cbcl.core._entries.entry), so the
 * name is bound once, to the entry, as the module or class is made: nothing is set on a
 * class or rebound afterwards. A module-level entry is a builtin function
 * (entry_function) whose PyMethodDef is the one in the state and whose self is the
 * module, which keeps that state alive; a method entry a cbcl._native.MethodEntry
 * (module.c), which the class body binds: a method descriptor that learns its class from
 * __set_name__ (self is checked to be an instance of it) and runs the entry's bind, which
 * finds the slots it reads there and keeps them in the state; its type keeps the module.
 */
#ifndef CBCL_ENTRY_H
#define CBCL_ENTRY_H

#include "native.h" /* (CEntry) */


/* Give `e` its fallback and documentation: 0, or -1 with an exception. */
static int
entry_set(CEntry *e, PyObject *fallback, PyObject *doc)
{
    if (!PyCallable_Check(fallback) || !PyUnicode_CheckExact(doc)) {
        PyErr_SetString(PyExc_TypeError, "an entry needs a callable and its doc (str)");
        return -1;
    }
    const char *text = PyUnicode_AsUTF8(doc); /* (cached in the str: lives as long) */
    if (text == NULL)
        return -1;
    Py_INCREF(fallback);
    Py_INCREF(doc);
    Py_XSETREF(e->fallback, fallback);
    e->def.ml_doc = text;
    Py_XSETREF(e->doc, doc); /* (an earlier doc is released after ml_doc has moved) */
    return 0;
}

/* Call a method entry's fallback as the descriptor was called: fallback(self, *args,
 * **kwargs), the keywords' values after the positional arguments (vectorcall's layout). */
static PyObject *
entry_call_method(CEntry *e, PyObject *self, PyObject *const *args, Py_ssize_t nargs,
                  PyObject *kwnames)
{
    PyObject *fallback = entry_fallback(e);
    if (fallback == NULL)
        return NULL;
    Py_ssize_t total = nargs + (kwnames == NULL ? 0 : PyTuple_GET_SIZE(kwnames));
    PyObject *small[8];
    PyObject **stack = small;
    if (total + 1 > 8) {
        stack = PyMem_Malloc((size_t)(total + 1) * sizeof(PyObject *));
        if (stack == NULL)
            return PyErr_NoMemory();
    }
    stack[0] = self;
    for (Py_ssize_t i = 0; i < total; i++)
        stack[i + 1] = args[i];
    PyObject *result = PyObject_Vectorcall(fallback, stack, (size_t)(nargs + 1), kwnames);
    if (stack != small)
        PyMem_Free(stack);
    return result;
}

/* A module-level entry: the builtin function of e's definition, in its fallback's module
 * (new reference, or NULL with an exception). */
static inline PyObject * /* (inline: a module that has none does not warn) */
entry_function(CEntry *e, PyObject *module)
{
    PyObject *name = PyObject_GetAttrString(e->fallback, "__module__");
    if (name == NULL)
        return NULL;
    PyObject *function = PyCFunction_NewEx(&e->def, module, name);
    Py_DECREF(name);
    return function;
}

/* Slots: an attribute that __slots__ (or a slots dataclass) gives a class is a member
 * descriptor of the class, which reads it: entry_member looks one up once (on the class,
 * a member descriptor returns itself), and the entries keep it and read through its
 * tp_descr_get, as getattr does (the Decoder's slots; a Message's fields are read from
 * its own struct, native.h's MessageFieldsObject, an Encoder's from encoders.c's
 * EncoderFieldsObject). */

/* The member descriptor of `type` for attribute `name`, the type's own (its
 * __objclass__): a new reference, or NULL (no exception) if that attribute is not one. */
static inline PyObject * /* (inline: a unit that has no slots to find does not warn) */
entry_member(PyTypeObject *type, const char *name)
{
    PyObject *d = PyObject_GetAttrString((PyObject *)type, name);
    if (d == NULL) {
        PyErr_Clear();
        return NULL;
    }
    if (!PyObject_TypeCheck(d, &PyMemberDescr_Type) || Py_TYPE(d)->tp_descr_get == NULL ||
            Py_TYPE(d)->tp_descr_set == NULL)
        goto not_one;
    PyObject *owner = PyObject_GetAttrString(d, "__objclass__");
    if (owner == NULL) {
        PyErr_Clear();
        goto not_one;
    }
    Py_DECREF(owner); /* (compared by identity only: the type holds its descriptor) */
    if (owner != (PyObject *)type)
        goto not_one;
    return d;
not_one:
    Py_DECREF(d);
    return NULL;
}

/* The value of member descriptor `d` (entry_member's) in `object`, an instance of its
 * type: a new reference, or NULL, and no exception, where it cannot be read (an unset
 * slot: its AttributeError is cleared; the caller declines, and the Python fallback
 * reads it again, to raise). */
static inline PyObject *
entry_get(PyObject *d, PyObject *object)
{
    PyObject *value = Py_TYPE(d)->tp_descr_get(d, object, (PyObject *)Py_TYPE(object));
    if (value == NULL)
        PyErr_Clear();
    return value;
}

#endif
