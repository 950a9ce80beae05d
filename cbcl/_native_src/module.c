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
 * PyModuleDef_Init; the import system creates the module and runs native_exec, which adds
 * each section's functions and runs each section's set-up (interned strings, the value
 * types of cbcl.core._values and decimal, the Decimal layout check, the escape table).
 *
 * Interpreters and the GIL. The sections keep process-wide state (interned strings,
 * types, the atom and token memos, the tables the setup functions are given): so the
 * module declares that it supports one interpreter only (Py_mod_multiple_interpreters:
 * NOT_SUPPORTED; a subinterpreter's import fails cleanly instead of sharing objects
 * across interpreters), and on free-threaded builds that it needs the GIL (Py_mod_gil:
 * Py_MOD_GIL_USED): the memos are read and written without locks, and the walks borrow
 * items of tuples and dicts that only the GIL keeps from changing under them.
 */
#include "native.h"

/* decimals_in_place() -> bool: whether the readers make decimals in place (the layout
 * check of cstack.h held in both units that make them), for the tests. */
static PyObject *
decimals_in_place(PyObject *Py_UNUSED(self), PyObject *Py_UNUSED(ignored))
{
    return PyBool_FromLong(cbcl_scanner_decimals_in_place() &&
                           cbcl_speedups_decimals_in_place());
}

static PyMethodDef native_methods[] = {
    {"decimals_in_place", decimals_in_place, METH_NOARGS,
     "decimals_in_place() -> bool: whether this module makes Decimals in place "
     "(cbcl/_native_src/cstack.h's layout check held), else by Decimal(text)."},
    {NULL, NULL, 0, NULL},
};

static int
native_exec(PyObject *module)
{
    if (PyModule_AddFunctions(module, native_methods) < 0 ||
        PyModule_AddFunctions(module, cbcl_scanner_methods) < 0 ||
        PyModule_AddFunctions(module, cbcl_speedups_methods) < 0 ||
        PyModule_AddFunctions(module, cbcl_encoders_methods) < 0)
        return -1;
    if (cbcl_scanner_exec(module) < 0 || cbcl_speedups_exec(module) < 0 ||
            cbcl_encoders_exec(module) < 0)
        return -1;
    return 0;
}

static PyModuleDef_Slot native_slots[] = {
    {Py_mod_exec, native_exec},
#if PY_VERSION_HEX >= 0x030C0000
    /* process-wide state (see above): not in more than one interpreter */
    {Py_mod_multiple_interpreters, Py_MOD_MULTIPLE_INTERPRETERS_NOT_SUPPORTED},
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
    .m_size = 0,
    .m_methods = NULL,
    .m_slots = native_slots,
};

PyMODINIT_FUNC
PyInit__native(void)
{
    return PyModuleDef_Init(&native_module);
}
