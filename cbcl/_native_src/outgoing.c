/* cbcl._native.check_outgoing and the validated encode: the outgoing check of a message
 * (cbcl.protocol._api.check_outgoing, the reference) in C, and in the same call as the
 * binary encode where an Encoder validates (encoders.c's encoder_encode calls
 * cbcl_outgoing_encoder_accepts before it writes the frame).
 *
 * Theory of operation
 * -------------------
 * The check is the reference's three steps, each of which may only ACCEPT here; anything
 * else DECLINES (0), and the caller runs the Python reference, which raises the exact
 * error (class, message, position, hint) or accepts:
 *
 *   1. the limits: a walk of the message's envelope and body that is the C twin of
 *      _api._within, more cautious where that is cheaper (a string whose 4 bytes a
 *      character may exceed max_string_bytes, a string holding a surrogate, a list
 *      nested deeper than this walk's own stack, anything not of an exact CBCL type):
 *      it accepts only what _within calls _WITHIN, so that the canonical text is never
 *      written;
 *   2. pass 2 and the schema: speedups.c's body_accepted (the LALR walk of the body by the
 *      protocol's acceptance plan, as the C decoder runs it, then the schema's fast pass),
 *      through cbcl_pass2_accepts;
 *   3. the constraints: a protocol with a (constraints …) section is declined by the
 *      encoder's path; check_outgoing (the function) leaves them to its Python caller.
 *
 * A refusal is never raised here: the reference raises it. The tables (the atoms'
 * terminals, the automaton's outcomes, the schema's head test) are given once by
 * setup_outgoing (cbcl/protocol/_api.py, at import); until then every call declines.
 * The limits of the last Limits object met are kept with a strong reference to it (a
 * Limits is a frozen dataclass: its values do not change). */
#include "native.h"

enum { DECLINE = 0, ACCEPT = 1 };
#define WALK_FRAMES 256 /* deeper bodies are declined (the reference judges them) */

typedef struct {
    PyObject *limits;  /* the last Limits met (strong), or NULL */
    long long max_message_bytes, max_depth, max_list_items, max_nodes, max_string_bytes,
        max_name_chars;
} LimitValues;

static const char *const limit_names[6] = {"max_message_bytes", "max_depth", "max_list_items",
                                           "max_nodes", "max_string_bytes", "max_name_chars"};

/* The limits of `limits` into st's cache: 1, or 0 to decline (not ints), -1 error. */
static int
limits_of(OutgoingState *out, PyObject *limits)
{
    LimitValues *lv = (LimitValues *)out->limit_values;
    if (lv->limits == limits)
        return 1;
    long long values[6];
    for (int i = 0; i < 6; i++) {
        PyObject *v = PyObject_GetAttrString(limits, limit_names[i]);
        if (v == NULL) {
            PyErr_Clear();
            return 0;
        }
        if (!PyLong_CheckExact(v)) {
            Py_DECREF(v);
            return 0;
        }
        int overflow = 0;
        values[i] = PyLong_AsLongLongAndOverflow(v, &overflow);
        Py_DECREF(v);
        if (overflow || values[i] < 0 || values[i] > ((long long)1 << 40)) {
            PyErr_Clear();
            return 0;
        }
    }
    Py_XSETREF(lv->limits, Py_NewRef(limits));
    lv->max_message_bytes = values[0];
    lv->max_depth = values[1];
    lv->max_list_items = values[2];
    lv->max_nodes = values[3];
    lv->max_string_bytes = values[4];
    lv->max_name_chars = values[5];
    return 1;
}

/* Whether a str of `len` characters is certainly within max_string bytes and free of
 * surrogates (what _within's _utf8_over decides only near the limit): 1, else 0. */
static int
text_ok(PyObject *s, long long max_string)
{
    Py_ssize_t len = PyUnicode_GET_LENGTH(s);
    if ((long long)len * 4 > max_string)
        return 0;
    int kind = PyUnicode_KIND(s);
    if (kind == PyUnicode_2BYTE_KIND) {
        const Py_UCS2 *d = PyUnicode_2BYTE_DATA(s);
        for (Py_ssize_t i = 0; i < len; i++)
            if (d[i] >= 0xD800 && d[i] <= 0xDFFF)
                return 0;
    }
    else if (kind == PyUnicode_4BYTE_KIND) {
        const Py_UCS4 *d = PyUnicode_4BYTE_DATA(s);
        for (Py_ssize_t i = 0; i < len; i++)
            if (d[i] >= 0xD800 && d[i] <= 0xDFFF)
                return 0;
    }
    return 1;
}

/* The twin of _api._within returning _WITHIN (1); 0 for anything else. */
static int
within(NativeState *st, MessageFieldsObject *m, const LimitValues *lv)
{
    PyTypeObject *symbol = st->values.inert[0], *keyword = st->values.inert[1],
                 *uri = st->values.inert[2];
    PyObject *decimal = st->values.decimal;
    if (symbol == NULL || decimal == NULL)
        return 0;
    if (!PyUnicode_Check(m->protocol) || !PyUnicode_Check(m->sender) ||
            !PyUnicode_Check(m->receiver))
        return 0;
    if (lv->max_name_chars < 15 || lv->max_list_items < 12 || lv->max_depth < 3 ||
            PyUnicode_GET_LENGTH(m->protocol) > lv->max_name_chars)
        return 0;
    long long fields = 5 + (m->conversation_id != Py_None) + (m->in_reply_to != Py_None) +
        (m->reply_by != Py_None) + (m->timestamp != Py_None) + (m->signature != Py_None) +
        (m->body != Py_None) + (m->trace != Py_None);
    long long size = 250 + PyUnicode_GET_LENGTH(m->protocol) +
        4 * (PyUnicode_GET_LENGTH(m->sender) + PyUnicode_GET_LENGTH(m->receiver));
    PyObject *texts[6] = {m->message_id, m->conversation_id, m->in_reply_to, m->trace,
                          NULL, NULL};
    if (m->signature != Py_None) {
        if ((PyObject *)Py_TYPE(m->signature) != (PyObject *)st->encoders.signature)
            return 0;
        SignatureFieldsObject *sig = (SignatureFieldsObject *)m->signature;
        if (sig->key_id == NULL || sig->value == NULL)
            return 0;
        texts[4] = sig->key_id;
        texts[5] = sig->value;
    }
    for (int i = 0; i < 6; i++) {
        PyObject *t = texts[i];
        if (t == NULL || t == Py_None)
            continue;
        if (!PyUnicode_Check(t) || !text_ok(t, lv->max_string_bytes))
            return 0;
        size += 6 * PyUnicode_GET_LENGTH(t) + 2;
    }
    long long nodes = 2 + 3 * fields + (m->signature != Py_None);
    if (m->body != Py_None) {
        long long deepest = lv->max_depth - 2;
        /* stack[k] is the list walked at len(stack) == k + 2 of the reference's walk (its
         * first iterator, over (body,), is the implicit level 1) */
        PyObject *lists[WALK_FRAMES];
        Py_ssize_t next[WALK_FRAMES];
        int depth = 0;
        PyObject *item = m->body;
        for (;;) {
            PyTypeObject *kind = Py_TYPE(item);
            if (kind == &PyUnicode_Type) {
                if (!text_ok(item, lv->max_string_bytes))
                    return 0;
                size += 6 * PyUnicode_GET_LENGTH(item);
            }
            else if (kind == &PyTuple_Type) {
                Py_ssize_t n = PyTuple_GET_SIZE(item);
                if (n > lv->max_list_items || depth + 1 > deepest || depth >= WALK_FRAMES)
                    return 0;
                nodes += n;
                lists[depth] = item;
                next[depth] = 0;
                depth++;
            }
            else if (kind == symbol || kind == keyword) {
                if (PyUnicode_GET_LENGTH(item) > lv->max_name_chars)
                    return 0;
                size += PyUnicode_GET_LENGTH(item);
            }
            else if (kind == &PyLong_Type) {
                int overflow = 0;
                (void)PyLong_AsLongLongAndOverflow(item, &overflow);
                if (overflow)
                    return 0;
            }
            else if (kind == uri) {
                size += 4 * PyUnicode_GET_LENGTH(item);
            }
            else if ((PyObject *)kind != decimal) {
                return 0;
            }
            /* the next item: of the innermost list with one left */
            while (depth > 0 && next[depth - 1] >= PyTuple_GET_SIZE(lists[depth - 1]))
                depth--;
            if (depth == 0)
                break;
            item = PyTuple_GET_ITEM(lists[depth - 1], next[depth - 1]);
            next[depth - 1]++;
        }
    }
    if (nodes > lv->max_nodes)
        return 0;
    return size + 43 * nodes > lv->max_message_bytes ? 0 : 1;
}

/* The check of `message` (an exact Message) of `protocol` under `limits`: ACCEPT,
 * DECLINE, or -1 with an exception. Constraints are not read here. */
static int
outgoing_accepts(NativeState *st, PyObject *protocol, PyObject *message, PyObject *limits,
                 long long *max_message_bytes)
{
    OutgoingState *out = &st->outgoing;
    if (out->terminals == NULL || st->encoders.message == NULL ||
            Py_TYPE(message) != st->encoders.message)
        return DECLINE;
    MessageFieldsObject *m = (MessageFieldsObject *)message;
    PyObject *const f[CBCL_MESSAGE_FIELDS] = {
        m->message_id, m->sender, m->receiver, m->intent, m->protocol, m->conversation_id,
        m->in_reply_to, m->reply_by, m->timestamp, m->trace, m->body, m->signature};
    for (int i = 0; i < CBCL_MESSAGE_FIELDS; i++)
        if (f[i] == NULL)
            return DECLINE;
    int r = limits_of(out, limits);
    if (r <= 0)
        return r;
    /* (a copy: pass 2 may run Python code, which may check another Limits) */
    LimitValues lv = *(const LimitValues *)out->limit_values;
    *max_message_bytes = lv.max_message_bytes;
    if (!within(st, m, &lv))
        return DECLINE;
    /* (held: pass 2 may run Python code, a Symbol's __eq__) */
    Py_INCREF(message);
    r = cbcl_pass2_accepts(st, protocol, m->intent, m->body, out->terminals, out->refused,
                           out->accept, out->has_heads, st->values.inert[0]);
    Py_DECREF(message);
    return r;
}

CBCL_INTERNAL int
cbcl_outgoing_encoder_accepts(NativeState *st, PyObject *encoder, PyObject *message,
                              PyObject *protocols, Py_ssize_t *max_bytes)
{
    OutgoingState *out = &st->outgoing;
    if (out->terminals == NULL || st->encoders.message == NULL ||
            Py_TYPE(message) != st->encoders.message || !PyDict_CheckExact(protocols))
        return DECLINE;
    PyObject *id = ((MessageFieldsObject *)message)->protocol;
    if (id == NULL || Py_TYPE(id) != st->values.inert[0])
        return DECLINE;
    PyObject *protocol = PyDict_GetItemWithError(protocols, id);
    if (protocol == NULL) {
        PyErr_Clear();
        return DECLINE;
    }
    Py_INCREF(protocol);
    PyObject *limits = NULL, *constraints = PyObject_GetAttr(protocol, out->s_constraints);
    int r = DECLINE;
    if (constraints == NULL) {
        PyErr_Clear();
        goto done;
    }
    if (constraints != Py_None)
        goto done;
    limits = PyObject_GetAttr(encoder, out->s_limits);
    if (limits == NULL) {
        PyErr_Clear();
        goto done;
    }
    long long most = 0;
    r = outgoing_accepts(st, protocol, message, limits, &most);
    if (r == ACCEPT)
        *max_bytes = most > PY_SSIZE_T_MAX ? PY_SSIZE_T_MAX : (Py_ssize_t)most;
done:
    Py_XDECREF(constraints);
    Py_XDECREF(limits);
    Py_DECREF(protocol);
    return r;
}

/* check_outgoing(protocol, message, limits) -> True | None */
static PyObject *
check_outgoing(PyObject *module, PyObject *const *args, Py_ssize_t nargs)
{
    NativeState *st = native_state(module);
    if (st == NULL)
        return NULL;
    if (nargs != 3) {
        PyErr_SetString(PyExc_TypeError, "check_outgoing(protocol, message, limits)");
        return NULL;
    }
    long long most = 0;
    int r = outgoing_accepts(st, args[0], args[1], args[2], &most);
    if (r < 0)
        return NULL;
    if (r == ACCEPT)
        Py_RETURN_TRUE;
    Py_RETURN_NONE;
}

/* setup_outgoing(terminals, refused, accept, has_heads) */
static PyObject *
setup_outgoing(PyObject *module, PyObject *const *args, Py_ssize_t nargs)
{
    NativeState *st = native_state(module);
    if (st == NULL)
        return NULL;
    if (nargs != 4 || !PyDict_CheckExact(args[0])) {
        PyErr_SetString(PyExc_TypeError,
                        "setup_outgoing(terminals: dict, refused, accept, has_heads)");
        return NULL;
    }
    OutgoingState *out = &st->outgoing;
    Py_XSETREF(out->terminals, Py_NewRef(args[0]));
    Py_XSETREF(out->refused, Py_NewRef(args[1]));
    Py_XSETREF(out->accept, Py_NewRef(args[2]));
    Py_XSETREF(out->has_heads, Py_NewRef(args[3]));
    Py_RETURN_NONE;
}

CBCL_INTERNAL PyMethodDef cbcl_outgoing_methods[] = {
    {"check_outgoing", (PyCFunction)(void (*)(void))check_outgoing, METH_FASTCALL,
     "check_outgoing(protocol, message, limits) -> True | None: True where the message "
     "is within the limits and pass 2 and the schema accept it (its constraints unread); "
     "None: the Python reference (cbcl.protocol._api.check_outgoing) must judge it."},
    {"setup_outgoing", (PyCFunction)(void (*)(void))setup_outgoing, METH_FASTCALL,
     "setup_outgoing(terminals, refused, accept, has_heads): the tables pass 2 reads."},
    {NULL, NULL, 0, NULL},
};

CBCL_INTERNAL int
cbcl_outgoing_exec(PyObject *Py_UNUSED(module), NativeState *st)
{
    OutgoingState *out = &st->outgoing;
    out->limit_values = PyMem_Calloc(1, sizeof(LimitValues));
    if (out->limit_values == NULL) {
        PyErr_NoMemory();
        return -1;
    }
    out->s_constraints = PyUnicode_InternFromString("constraints");
    out->s_limits = PyUnicode_InternFromString("limits");
    return out->s_constraints == NULL || out->s_limits == NULL ? -1 : 0;
}

CBCL_INTERNAL int
cbcl_outgoing_traverse(NativeState *st, visitproc visit, void *arg)
{
    OutgoingState *out = &st->outgoing;
    Py_VISIT(out->terminals);
    Py_VISIT(out->refused);
    Py_VISIT(out->accept);
    Py_VISIT(out->has_heads);
    if (out->limit_values != NULL)
        Py_VISIT(((LimitValues *)out->limit_values)->limits);
    return 0;
}

CBCL_INTERNAL void
cbcl_outgoing_clear(NativeState *st)
{
    OutgoingState *out = &st->outgoing;
    Py_CLEAR(out->terminals);
    Py_CLEAR(out->refused);
    Py_CLEAR(out->accept);
    Py_CLEAR(out->has_heads);
    Py_CLEAR(out->s_constraints);
    Py_CLEAR(out->s_limits);
    if (out->limit_values != NULL) {
        Py_CLEAR(((LimitValues *)out->limit_values)->limits);
        PyMem_Free(out->limit_values);
        out->limit_values = NULL;
    }
}
