/* intern.c's intern tables of names (cbcl._native.NameTable), as scanner.c, speedups.c
 * (through cbcl_intern_name) and module.c use them. See intern.c's theory of operation. */
#ifndef CBCL_INTERN_H
#define CBCL_INTERN_H

#include "native.h"

/* One slot: the atom (strong; NULL: empty) and the hash of its name (str's hash). */
typedef struct {
    Py_hash_t hash;
    PyObject *atom;
} NameSlot;

/* A table of the atoms of one kind (which: 0 Symbol, 1 Keyword) by name, at most `bound`
 * of them: open addressing over 2^k >= 2 * bound slots (never regrown), emptied down to
 * `pinned` (a dict name -> atom, strong) when a new name finds it full. */
typedef struct {
    PyObject_HEAD
    NameSlot *slots;
    size_t mask;        /* slots - 1 */
    Py_ssize_t used;    /* atoms held */
    Py_ssize_t bound;   /* the most atoms held (cbcl.core._values.INTERN_MAX) */
    PyObject *pinned;   /* dict: the names kept through an emptying */
    int which;          /* 0 Symbol, 1 Keyword (ValueTypes.inert's index) */
    int hash_of_bytes;  /* 1: names are hashed from their bytes (checked against str's) */
} NameTable;

/* Whether `obj` is a NameTable (of any module object). */
CBCL_INTERNAL int cbcl_is_name_table(PyObject *obj);

/* The atom `t` holds for the name spelled by the ASCII p[0:n]: a new reference, made and
 * entered on a miss (the table emptied down to its pinned names, and the memos forgotten,
 * if it is full); NULL with an exception. */
CBCL_INTERNAL PyObject *cbcl_names_intern_ascii(NativeState *st, NameTable *t,
                                                const char *p, Py_ssize_t n);

/* The atom `t` holds for `name` (an exact str, a valid name: not checked): a new
 * reference, made and entered on a miss as by cbcl_names_intern_ascii; NULL with an
 * exception. */
CBCL_INTERNAL PyObject *cbcl_names_intern(NativeState *st, NameTable *t, PyObject *name);

/* Adds the NameTable type to the module (before scanner.c's exec, which imports
 * cbcl.core._values, which makes its tables). */
CBCL_INTERNAL int cbcl_intern_exec(PyObject *module);

/* scanner.c's: forget every atom the native memos hold (and the reader's token cache). */
CBCL_INTERNAL void cbcl_forget_memos(NativeState *st);

/* scanner.c's: a new atom of type vt->inert[which] spelled by the ASCII p[0:n], its cached
 * hash `hash` (-1: not known) (as cbcl_new_atom makes one of a str). */
CBCL_INTERNAL PyObject *cbcl_new_atom_ascii(const ValueTypes *vt, int which, const char *p,
                                            Py_ssize_t n, Py_hash_t hash);

#endif
