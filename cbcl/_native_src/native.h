/* What the sources of cbcl._native (module.c, scanner.c, speedups.c, encoders.c: one
 * extension module, several translation units) declare to one another: the module's state
 * (NativeState, below: everything the module keeps between calls), each section's method
 * table, set-up, and the visit and clear of its part of the state, run by module.c, and the
 * scanner's reader, which speedups.c's parse entry calls directly. Not exported from the
 * shared object. */
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

/* The sizes the sections' parts of the state are made of (each section checks its own
 * names for them against these, below its enums). */
#define CBCL_TOKEN_CODES 7     /* LPAR .. URI: the token codes below FIRST_ENTRY */
#define CBCL_MESSAGE_FIELDS 12 /* a Message's fields, in grammar order */
#define CBCL_PARSE_LIMITS 6    /* the default limits the parse entry reads */
#define CBCL_FRAME_BITS 7      /* the present bits of a frame's optional fields */
#define CBCL_MEMO_SLOTS 4096   /* the slots of each direct-mapped memo of atoms */
#define CBCL_FIELD_PREFIX_MAX 40

typedef struct NativeState NativeState;

/* A slot of a direct-mapped memo of atoms by their text's bytes (the text reader's token
 * memo, the binary decoder's atom memo; cstack.h): the text (an exact ASCII str) and the
 * atom made of it, under a kind (0 where the memo has one). */
typedef struct {
    PyObject *key;   /* the text, or NULL */
    PyObject *value; /* its atom */
    long kind;
} MemoSlot;

/* A C entry point standing in for a Python function or method, its fallback (entry.h): a
 * copy, in the module's state, of a section's static const template. */
typedef struct CEntry {
    PyMethodDef def;    /* ml_name, ml_flags (and a function's ml_meth) from the template;
                         * ml_doc from `doc` */
    /* A method's: called by its MethodEntry (module.c) with the module's state and the
     * instance; the arguments after self as vectorcall has them (none for METH_NOARGS). */
    PyObject *(*method)(NativeState *st, PyObject *self, PyObject *const *args,
                        Py_ssize_t nargs, PyObject *kwnames);
    /* A method's: called when the class that binds it is made (__set_name__) with that
     * class, to find what it reads there; 0, or -1 with an exception. NULL: nothing. */
    int (*bind)(NativeState *st, PyTypeObject *owner);
    PyObject *fallback; /* strong reference: the Python function (NULL: not given yet) */
    PyObject *doc;      /* strong reference: ml_doc points into its UTF-8 */
} CEntry;

/* e's fallback (borrowed), or NULL with RuntimeError where the module's state has been
 * cleared (a module torn down under a call). */
static inline PyObject *
entry_fallback(const CEntry *e)
{
    if (e->fallback == NULL)
        PyErr_Format(PyExc_RuntimeError, "cbcl._native's entry %s has no fallback",
                     e->def.ml_name);
    return e->fallback;
}

/* cbcl._native.MessageFields and SignatureFields (module.c): the storage of
 * cbcl.protocol._message.Message and Signature, dataclasses over these C types. Each field
 * is a named member of the struct (a PyMemberDef of the type, read and written by name
 * from Python, NULL while unset), so the C writers and readers take a Message's fields
 * from, and give them to, its own struct, no descriptor in between. setup_message()
 * registers the Message and Signature classes once it has checked they add nothing to this
 * layout (the same tp_basicsize, no __dict__): the walks then serve their exact instances. */
typedef struct {
    PyObject_HEAD
    /* the envelope's fields in grammar order (strong references; NULL: unset) */
    PyObject *message_id, *sender, *receiver, *intent, *protocol, *conversation_id,
        *in_reply_to, *reply_by, *timestamp, *trace, *body, *signature;
} MessageFieldsObject;

typedef struct {
    PyObject_HEAD
    PyObject *key_id, *value; /* strong references; NULL: unset */
} SignatureFieldsObject;

/* The fields of `o` (a MessageFields instance) in grammar order, as new references in
 * out[0..CBCL_MESSAGE_FIELDS): 1, or 0 (nothing kept) if one is unset. */
static inline int
message_fields_get(PyObject *o, PyObject **out)
{
    MessageFieldsObject *m = (MessageFieldsObject *)o;
    PyObject *const f[CBCL_MESSAGE_FIELDS] = {
        m->message_id, m->sender, m->receiver, m->intent, m->protocol, m->conversation_id,
        m->in_reply_to, m->reply_by, m->timestamp, m->trace, m->body, m->signature};
    for (int i = 0; i < CBCL_MESSAGE_FIELDS; i++)
        if (f[i] == NULL)
            return 0;
    for (int i = 0; i < CBCL_MESSAGE_FIELDS; i++)
        out[i] = Py_NewRef(f[i]);
    return 1;
}

/* A new instance of `type` (a registered Message class: setup_message() checked its
 * layout) given the fields `values`, in grammar order (NULL: None): a new reference, or
 * NULL with an exception. No __init__ runs: the caller has checked the fields. */
CBCL_INTERNAL PyObject *cbcl_message_new(PyTypeObject *type, PyObject *const *values);

/* A new instance of `type` (a registered Signature class) given key_id and value. */
CBCL_INTERNAL PyObject *cbcl_signature_new(PyTypeObject *type, PyObject *key_id,
                                           PyObject *value);

/* cstack.h's: the types of the values the readers make, and its Decimal layout check. */
typedef struct {
    PyTypeObject *inert[3]; /* cbcl.core._values' Symbol, Keyword, URI (strong) */
    PyObject *decimal;      /* decimal.Decimal (strong) */
    int in_place;           /* 1: the layout check held (decimals made in place) */
    int untrackable;        /* 1: a Decimal visits only its type (may be untracked) */
    int atoms_in_place;     /* 1: atoms are written by cbcl_new_atom's direct fill (scanner.c
                             * checked the layout at exec); 0: made by str.__new__ */
} ValueTypes;

/* scanner.c's: the reader's intern tables as setup_intern gave them (cbcl.core._values'
 * SYMBOL_TABLE and KEYWORD_TABLE: intern.c's NameTables, each with its bound and pinned
 * names) and the bounds of the reader's token cache, so that a name never seen before is
 * interned here, without a call into Python (cbcl_intern_name). `symbols` NULL: not set
 * up (make_atom is called). */
typedef struct {
    PyObject *symbols, *keywords; /* NameTables (intern.h; strong) */
    PyObject *cache;        /* the reader's token cache (_CACHE), emptied with a table */
    Py_ssize_t cache_chars; /* _CACHED_CHARS: the longest token the token cache keeps */
    Py_ssize_t cache_max;   /* _CACHE_MAX: a token cache this full is emptied */
} InternTables;

/* scanner.c's: the token memo in front of the reader's token cache, the intern tables. */
typedef struct {
    MemoSlot memo[CBCL_MEMO_SLOTS];
    InternTables intern;
} ScannerState;

/* speedups.c's. */
typedef struct {
    /* interned strings: the automaton's token classes, attribute and keyword names */
    PyObject *s_lpar, *s_rpar, *s_end, *s_string, *s_integer, *s_kinds[CBCL_TOKEN_CODES];
    PyObject *s_packed, *s_min_length, *s_max_length, *s_item, *s_start, *s_acceptance;
    PyObject *s_registry, *s_protocols_by_id, *s_one_shot;
    PyObject *s_cbcl_converter, *s_type; /* records.c's type= hook: "__cbcl_converter__" */
    /* records.c: the class cbcl_record_of_decoded last found a converter for, the version
     * tags the class and its metaclass had then and that converter (all borrowed: the
     * pointers are only compared, or read while the tags say the class holds it) */
    PyObject *record_type, *record_converter;
    unsigned int record_version, record_meta_version;
    PyTypeObject *frame_state_type; /* cbcl._native.FrameState, this module's */
    /* the decoder's atom memo in front of its own caches */
    MemoSlot atom_memo[CBCL_MEMO_SLOTS];
    /* the last two tuples of attribute names new_with_attributes found to be a Message's
     * fields in grammar order (strong references, or NULL) */
    PyObject *grammar_names, *grammar_names_also;
    /* cbcl.protocol._schema._Pairs and its `packed` member descriptor, once met */
    PyTypeObject *pairs_type;
    PyObject *pairs_packed;
    /* walk's memo of the transitions it took (speedups.c's Passages), made at the first
     * walk (NULL: not yet) */
    struct PassageSlots *passages;
    /* Decoder.decode: its entry, the trust store's check, the Decoder's slots */
    CEntry decode_entry;
    PyObject *decode_verified, *decoder_frame_state, *decoder_require, *decoder_registry;
    /* cbcl.parse: its entry and what parse_entry gave it */
    CEntry parse_entry;
    PyObject *parse_verified, *parse_space_after, *parse_tables, *parse_cache, *parse_atom;
    Py_ssize_t parse_limits[CBCL_PARSE_LIMITS];
    PyObject *parse_declined;       /* the careful continuation of a declined document */
    PyObject *parse_constraints;    /* the constraint check of an accepted message */
    PyObject *parse_last_registry;  /* a weak reference, or NULL */
    PyObject *parse_last_protocols; /* its dict of every loaded protocol (_protocols) */
    PyObject *parse_last_fast;      /* its dict of those without constraints (_fast) */
    /* cbcl.decode: its entry and what one_shot_entry gave it */
    CEntry one_shot_entry;
    PyObject *one_shot_verified;
    PyTypeObject *one_shot_registry, *one_shot_memos;
    PyObject *memos_default_state;
} SpeedupsState;

/* encoders.c's: what setup(), setup_message() and setup_frame() gave, and the entries. */
typedef struct {
    PyTypeObject *symbol, *keyword, *uri, *decimal;
    Py_ssize_t max_decimal_chars; /* -1: setup() has not run; every twin declines */
    long c_lpar, c_rpar, c_integer, c_decimal, c_symbol, c_keyword, c_uri, c_first;
    int decimal_layout; /* 1: a Decimal's mpd_t is read directly */
    PyTypeObject *message, *signature, *registry;
    PyObject *text_names, *text_intents, *frame_intents;
    long frame_bits[CBCL_FRAME_BITS];
    char field_prefix[CBCL_MESSAGE_FIELDS][CBCL_FIELD_PREFIX_MAX];
    Py_ssize_t field_prefix_length[CBCL_MESSAGE_FIELDS];
    PyObject *s_protocols; /* "_protocols_by_id" */
    CEntry canonical_entry, encode_entry;
    /* cbcl._native.EncoderFields (this module's), and the class encode_entry was bound in
     * where it is over EncoderFields (encoder_bind; NULL: every call falls back) */
    PyTypeObject *encoder_fields_type, *encoder_type;
} EncodersState;

/* outgoing.c's: what setup_outgoing() gave (pass 2's tables), interned names, and the
 * limits of the last Limits met (its LimitValues, allocated at exec). */
typedef struct {
    PyObject *terminals, *refused, *accept, *has_heads; /* strong; NULL: not set up */
    PyObject *s_constraints, *s_limits;
    void *limit_values;
} OutgoingState;

/* The module's state (PyModuleDef.m_size): one per module object, so one per interpreter
 * that imports the module. Zeroed when the module is made; filled by native_exec and by
 * the set-up and *_entry functions the Python side calls; visited and cleared by the
 * module's m_traverse and m_clear (each section's part by its own functions). */
struct NativeState {
    int ready;                      /* 1 from the end of native_exec to m_clear */
    PyTypeObject *method_entry_type; /* cbcl._native.MethodEntry, this module's */
    /* cbcl._native.MessageFields and SignatureFields, this module's (module.c) */
    PyTypeObject *message_fields_type, *signature_fields_type;
    ValueTypes values;
    ScannerState scanner;
    SpeedupsState speedups;
    EncodersState encoders;
    OutgoingState outgoing;
};

/* The state of `module` (a module made from this definition: a function's self), or NULL
 * with RuntimeError once it has been cleared (a module torn down under a call). */
static inline NativeState *
native_state(PyObject *module)
{
    NativeState *st = (NativeState *)PyModule_GetState(module);
    if (st != NULL && st->ready)
        return st;
    if (!PyErr_Occurred())
        PyErr_SetString(PyExc_RuntimeError, "cbcl._native's state is cleared");
    return NULL;
}

/* A method entry of `e` (module.c's cbcl._native.MethodEntry, of st's module): a new
 * reference, or NULL with an exception. */
CBCL_INTERNAL PyObject *cbcl_method_entry(NativeState *st, CEntry *e);

CBCL_INTERNAL extern PyMethodDef cbcl_scanner_methods[];
CBCL_INTERNAL extern PyMethodDef cbcl_speedups_methods[];
CBCL_INTERNAL extern PyMethodDef cbcl_encoders_methods[];
CBCL_INTERNAL extern PyMethodDef cbcl_outgoing_methods[];

/* Each section's set-up at the module's exec: 0, or -1 with an exception. The scanner's
 * makes st->values (cstack.h), which the others read. */
CBCL_INTERNAL int cbcl_scanner_exec(PyObject *module, NativeState *st);
CBCL_INTERNAL int cbcl_speedups_exec(PyObject *module, NativeState *st);
CBCL_INTERNAL int cbcl_encoders_exec(PyObject *module, NativeState *st);
/* session.c's: adds cbcl._native.SessionState (it keeps no part of the state). */
CBCL_INTERNAL int cbcl_session_exec(PyObject *module, NativeState *st);

/* Each section's part of m_traverse (every object reference it holds; 0, or what visit
 * returned) and of m_clear (every reference released, the part as if never set up). */
CBCL_INTERNAL int cbcl_scanner_traverse(NativeState *st, visitproc visit, void *arg);
CBCL_INTERNAL int cbcl_speedups_traverse(NativeState *st, visitproc visit, void *arg);
CBCL_INTERNAL int cbcl_encoders_traverse(NativeState *st, visitproc visit, void *arg);
CBCL_INTERNAL void cbcl_scanner_clear(NativeState *st);
CBCL_INTERNAL void cbcl_speedups_clear(NativeState *st);
CBCL_INTERNAL void cbcl_encoders_clear(NativeState *st);
CBCL_INTERNAL int cbcl_outgoing_exec(PyObject *module, NativeState *st);
CBCL_INTERNAL int cbcl_outgoing_traverse(NativeState *st, visitproc visit, void *arg);
CBCL_INTERNAL void cbcl_outgoing_clear(NativeState *st);

/* speedups.c's pass 2 of a body by `protocol`'s acceptance plan and its schema (the C
 * decoder's body_accepted): 1 accepted, 0 to leave to the Python path, -1 with an
 * exception. */
CBCL_INTERNAL int cbcl_pass2_accepts(NativeState *st, PyObject *protocol, PyObject *intent,
                                     PyObject *body, PyObject *terminals, PyObject *refused,
                                     PyObject *accept, PyObject *has_heads,
                                     PyTypeObject *symbol_type);

/* outgoing.c's check of a message an Encoder (`encoder`, whose `limits` it reads) is to
 * encode validated, its protocol found in `protocols` (the registry's dict by id): 1 where
 * the limits, pass 2 and the schema accept it and the protocol has no constraints
 * (*max_bytes then the frame's limit), 0 to leave it to the Python reference, -1 with an
 * exception. */
CBCL_INTERNAL int cbcl_outgoing_encoder_accepts(NativeState *st, PyObject *encoder,
                                                PyObject *message, PyObject *protocols,
                                                Py_ssize_t *max_bytes);

/* An entry's references (entry.h): visited, and released (its ml_doc with its doc). */
#define CBCL_VISIT_ENTRY(e) \
    do { Py_VISIT((e).fallback); Py_VISIT((e).doc); } while (0)
#define CBCL_CLEAR_ENTRY(e) \
    do { (e).def.ml_doc = NULL; Py_CLEAR((e).fallback); Py_CLEAR((e).doc); } while (0)

/* The interned Symbol (keyword 0) or Keyword (keyword 1) named `name` (an exact str, a
 * valid name: not checked), made and entered in the reader's intern table on a miss, as
 * cbcl.core._reader.intern_symbol/intern_keyword do: a new reference; Py_None (new
 * reference) where setup_intern has not run, to call the Python twin instead; NULL with
 * an exception. */
CBCL_INTERNAL PyObject *cbcl_intern_name(NativeState *st, int keyword, PyObject *name);

/* cbcl_intern_name for a name the caller has just looked up in its cache and not found:
 * since the tables are intern.c's NameTables (no caller's cache is one), the same as
 * cbcl_intern_name (kept for its callers). */
CBCL_INTERNAL PyObject *cbcl_intern_new_name(NativeState *st, int keyword, PyObject *name);

/* scanner.c's: whether the ASCII p[0:n] is a keyword's name or, where `symbol`, a
 * symbol's (the reader's NAME and NUMBERLIKE rules over bytes). */
CBCL_INTERNAL int cbcl_ascii_name(const unsigned char *p, Py_ssize_t n, int symbol);

/* A new atom of type vt->inert[which] (0 Symbol, 1 Keyword, 2 URI) spelled `text` (an
 * exact str), as str.__new__(type, text) makes it, not tracked by the collector (it refers
 * to its type only): a new reference, or NULL with an exception (scanner.c). */
CBCL_INTERNAL PyObject *cbcl_new_atom(const ValueTypes *vt, int which, PyObject *text);

/* The scanner's reader of one value (scanner.c's read_value, its arguments checked: text
 * a str, cache a dict, utf8 the text's UTF-8 as bytes or Py_None): the value at character
 * pos, with *end (the character after it) and *nodes set; None to leave it to the Python
 * tiers; NULL with an exception (MemoryError, or one make_atom raised). */
CBCL_INTERNAL PyObject *cbcl_read_value_of(NativeState *st, PyObject *text, Py_ssize_t pos,
                                           PyObject *cache, PyObject *make_atom,
                                           Py_ssize_t depth_left, Py_ssize_t max_items,
                                           Py_ssize_t budget, Py_ssize_t max_string,
                                           Py_ssize_t max_name, PyObject *utf8,
                                           Py_ssize_t *end_out, Py_ssize_t *nodes_out);

#endif
