/* What cbcl._scanner exports to the other C modules: its reader of one value, as a
 * function pointer in the capsule cbcl._scanner._C_API (PyCapsule_Import). */
#ifndef CBCL_SCANNER_H
#define CBCL_SCANNER_H

#define PY_SSIZE_T_CLEAN
#include <Python.h>

#define SCANNER_CAPSULE "cbcl._scanner._C_API"

/* read_value's work (cbcl._scanner.read_value, its arguments checked: text a str, cache a
 * dict, utf8 text's UTF-8 as bytes or Py_None): the value at character pos, with *end
 * (the character after it) and *nodes set; None to leave it to the Python tiers; NULL with
 * an exception (MemoryError, or one make_atom raised). */
typedef PyObject *(*ReadValueOf)(PyObject *text, Py_ssize_t pos, PyObject *cache,
                                 PyObject *make_atom, Py_ssize_t depth_left,
                                 Py_ssize_t max_items, Py_ssize_t budget,
                                 Py_ssize_t max_string, Py_ssize_t max_name, PyObject *utf8,
                                 Py_ssize_t *end, Py_ssize_t *nodes);

#endif
