/* What the sources of cbcl._native (module.c, scanner.c, speedups.c, encoders.c: one
 * extension module, several translation units) declare to one another: each section's
 * method table and set-up, run by module.c's exec, and the scanner's reader, which
 * speedups.c's parse entry calls directly. Not exported from the shared object. */
#ifndef CBCL_NATIVE_H
#define CBCL_NATIVE_H

#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stddef.h> /* (offsetof, for the PyMemberDef tables: structmember.h, which
                     * brought it in, is included below only before 3.12) */
#if PY_VERSION_HEX < 0x030C0000 /* (Python.h has these names from 3.12 on: the
                                  * PyMemberDef types and flags) */
#include <structmember.h>
#define Py_T_OBJECT_EX T_OBJECT_EX
#define Py_T_PYSSIZET T_PYSSIZET
#define Py_READONLY READONLY
#endif

#if defined(__GNUC__) || defined(__clang__)
#define CBCL_INTERNAL __attribute__((visibility("hidden")))
#else
#define CBCL_INTERNAL
#endif

/* A C entry point standing in for a Python function or method, its fallback (entry.h). */
typedef struct CEntry {
    PyMethodDef def;    /* ml_name, ml_meth and ml_flags static; ml_doc from `doc` */
    PyObject *fallback; /* strong reference: the Python function */
    PyObject *doc;      /* strong reference: ml_doc points into its UTF-8 */
    /* A method's: called when the class that binds it is made (__set_name__) with that
     * class, to find what it reads there; 0, or -1 with an exception. NULL: nothing. */
    int (*bind)(PyTypeObject *owner);
} CEntry;

/* A method entry of `e` (module.c's cbcl._native.MethodEntry): a new reference, or NULL
 * with an exception. */
CBCL_INTERNAL PyObject *cbcl_method_entry(CEntry *e);

CBCL_INTERNAL extern PyMethodDef cbcl_scanner_methods[];
CBCL_INTERNAL extern PyMethodDef cbcl_speedups_methods[];
CBCL_INTERNAL extern PyMethodDef cbcl_encoders_methods[];

/* Each section's set-up at the module's exec: 0, or -1 with an exception. */
CBCL_INTERNAL int cbcl_scanner_exec(PyObject *module);
CBCL_INTERNAL int cbcl_speedups_exec(PyObject *module);
CBCL_INTERNAL int cbcl_encoders_exec(PyObject *module);

/* Whether the unit's decimal_of makes Decimals in place (cstack.h's layout check). */
CBCL_INTERNAL int cbcl_scanner_decimals_in_place(void);
CBCL_INTERNAL int cbcl_speedups_decimals_in_place(void);

/* The scanner's reader of one value (scanner.c's read_value, its arguments checked: text
 * a str, cache a dict, utf8 the text's UTF-8 as bytes or Py_None): the value at character
 * pos, with *end (the character after it) and *nodes set; None to leave it to the Python
 * tiers; NULL with an exception (MemoryError, or one make_atom raised). */
CBCL_INTERNAL PyObject *cbcl_read_value_of(PyObject *text, Py_ssize_t pos, PyObject *cache,
                                           PyObject *make_atom, Py_ssize_t depth_left,
                                           Py_ssize_t max_items, Py_ssize_t budget,
                                           Py_ssize_t max_string, Py_ssize_t max_name,
                                           PyObject *utf8, Py_ssize_t *end_out,
                                           Py_ssize_t *nodes_out);

#endif
