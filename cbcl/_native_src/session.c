/* cbcl._native.SessionState: an established session's per-message checks, one call per
 * direction (the twin of cbcl.session._session.Session's reference path, issue 30 item 1).
 *
 * Theory of operation
 * -------------------
 * Once a binary session is ESTABLISHED, cbcl.session._session.Session makes one of these
 * (Session._start_native) holding what its per-message checks read: the decoder's and the
 * encoder's entries (their C methods, which decode a frame through pass 2 and the schema,
 * and encode a message), the parties, the skew bound, the replay window (a ring of the
 * last `replay_window` message ids and their set, as Session._seen and _seen_set), and the
 * agreed protocol's conversation machine as an integer table (state, intent, role) ->
 * state (cbcl.protocol._conversation.machine_table) with the open conversations (a dict by
 * conversation id; the session's two parties make one thread per id) and a ring of the
 * last `max_open` finished ids, as ConversationTracker(max_open=…, forget_finished=True).
 *
 * receive(frame, now) decodes the frame (length prefix already cut), checks parties, skew
 * and replay, steps the conversation and returns (Message, Step); send(message, now)
 * steps the conversation, encodes and frames and returns (bytes, Step). Every check runs
 * before anything changes. Anything else — a refusal of any kind, a NOT-UNDERSTOOD, a
 * frame the decoder refuses — returns an int (a refusal code, below) and changes
 * nothing: the session then hands its state to the Python reference (threads(),
 * window(), finished()), which raises exactly today's error or accepts the message, and
 * hands the state back (load()). So error texts, and the fuzz invariant, stay the
 * reference's; tests/test_native_session.py holds the two to the same outcomes and state.
 *
 * A thread is a list [started by the peer (bool), state index, {message id: role index},
 * reply-by deadline (int) or None, the role index it awaits, [Step, …]].
 */
#include "native.h"

/* Why receive or send declined (the Python reference then judges the message). */
enum {
    SS_DECODE = 1,   /* the decoder raised */
    SS_INTENT,       /* NOT-UNDERSTOOD, or an intent outside the table */
    SS_PARTIES,      /* not from the peer to this side (or the reverse, sending) */
    SS_STALE,        /* no timestamp, or one beyond the skew bound */
    SS_REPLAY,       /* an id in the replay window */
    SS_CONVERSATION, /* the conversation machine refuses it */
    SS_FRAME,        /* an encoding no frame holds */
};

enum { T_STARTER, T_STATE, T_SEEN, T_DEADLINE, T_AWAITED, T_HISTORY, T_SIZE };

/* A bounded ring of keys (strong references) and their set: insertion order, the oldest
 * dropped past `cap`. */
typedef struct {
    PyObject **items;
    Py_ssize_t cap, start, len;
    PyObject *set;
} Ring;

static int
ring_init(Ring *r, Py_ssize_t cap)
{
    r->items = PyMem_Calloc((size_t)cap, sizeof(PyObject *));
    r->set = PySet_New(NULL);
    r->cap = cap;
    r->start = r->len = 0;
    if (r->items == NULL || r->set == NULL) {
        PyErr_NoMemory();
        return -1;
    }
    return 0;
}

static void
ring_clear(Ring *r)
{
    if (r->items != NULL)
        for (Py_ssize_t i = 0; i < r->len; i++)
            Py_CLEAR(r->items[(r->start + i) % r->cap]);
    r->start = r->len = 0;
    if (r->set != NULL)
        PySet_Clear(r->set);
}

static void
ring_free(Ring *r)
{
    ring_clear(r);
    PyMem_Free(r->items);
    r->items = NULL;
    Py_CLEAR(r->set);
}

/* Add `key` (not in the ring): 0, or -1 with an exception (nothing changed). */
static int
ring_push(Ring *r, PyObject *key)
{
    if (PySet_Add(r->set, key) < 0)
        return -1;
    if (r->len == r->cap) {
        PyObject *old = r->items[r->start];
        r->items[r->start] = NULL;
        r->start = (r->start + 1) % r->cap;
        r->len--;
        if (PySet_Discard(r->set, old) < 0) {
            Py_DECREF(old);
            return -1;
        }
        Py_DECREF(old);
    }
    r->items[(r->start + r->len) % r->cap] = Py_NewRef(key);
    r->len++;
    return 0;
}

static PyObject *
ring_list(Ring *r)
{
    PyObject *list = PyList_New(r->len);
    if (list == NULL)
        return NULL;
    for (Py_ssize_t i = 0; i < r->len; i++)
        PyList_SET_ITEM(list, i, Py_NewRef(r->items[(r->start + i) % r->cap]));
    return list;
}

/* Replace the ring's keys by those of `keys` (a list, oldest first; the last `cap` kept). */
static int
ring_load(Ring *r, PyObject *keys)
{
    if (!PyList_Check(keys)) {
        PyErr_SetString(PyExc_TypeError, "a ring loads from a list");
        return -1;
    }
    ring_clear(r);
    for (Py_ssize_t i = 0; i < PyList_GET_SIZE(keys); i++)
        if (ring_push(r, PyList_GET_ITEM(keys, i)) < 0)
            return -1;
    return 0;
}

static int
ring_traverse(Ring *r, visitproc visit, void *arg)
{
    if (r->items != NULL)
        for (Py_ssize_t i = 0; i < r->len; i++)
            Py_VISIT(r->items[(r->start + i) % r->cap]);
    Py_VISIT(r->set);
    return 0;
}

typedef struct {
    PyObject_HEAD
    PyObject *decode, *encode;  /* the decoder's and encoder's bound methods */
    PyObject *message_type;     /* the Message class (over MessageFields) */
    PyObject *me, *peer, *protocol;
    long long max_skew;
    Ring window;
    /* the conversation machine (has_machine 0: the protocol declares none) */
    int has_machine;
    Py_ssize_t n_states, n_intents, initial, cancelled, not_understood, cancel;
    int *table;            /* [(state * n_intents + intent) * 2 + role] -> state, or -1 */
    unsigned char *final;  /* [state]: final (cancelled among them) */
    PyObject *intents;     /* tuple: the Intent members in the table's order */
    PyObject *states, *roles, *step_type, *open, *ints;
    PyObject *step_names;  /* tuple: Step's fields, in its constructor's order */
    PyObject *empty;       /* () */
    Py_ssize_t max_open;
    Ring finished;
} SessionState;

static PyObject *
ss_new(PyTypeObject *type, PyObject *args, PyObject *kwargs)
{
    static const char *const names[] = {
        "decode", "encode", "message_type", "me", "peer", "protocol", "max_skew_ms",
        "replay_window", "table", "intents", "states", "roles", "final", "initial",
        "step_type", "max_open", NULL};
    PyObject *decode, *encode, *message_type, *me, *peer, *protocol, *table, *intents;
    PyObject *states, *roles, *final, *step_type;
    long long max_skew;
    Py_ssize_t window, initial, max_open;
    if (PyTuple_GET_SIZE(args) != 0) {
        PyErr_SetString(PyExc_TypeError, "SessionState() takes keyword arguments only");
        return NULL;
    }
    if (!PyArg_ParseTupleAndKeywords(
            args, kwargs, "$OOO!OOOLnOO!OOOnOn:SessionState", (char **)names, &decode,
            &encode, &PyType_Type, &message_type, &me, &peer, &protocol, &max_skew, &window,
            &table, &PyTuple_Type, &intents, &states, &roles, &final, &initial, &step_type,
            &max_open))
        return NULL;
    PyObject *module = PyType_GetModule(type);
    NativeState *st = module == NULL ? NULL : native_state(module);
    if (st == NULL)
        return NULL;
    if (!PyCallable_Check(decode) || !PyCallable_Check(encode) ||
            !PyType_IsSubtype((PyTypeObject *)message_type, st->message_fields_type) ||
            window < 1 || max_open < 1 || max_skew < 0) {
        PyErr_SetString(PyExc_TypeError, "SessionState(): a field of the wrong type");
        return NULL;
    }
    int has_machine = table != Py_None;
    Py_ssize_t n_states = 0, n_intents = PyTuple_GET_SIZE(intents);
    if (has_machine) {
        if (!PyTuple_CheckExact(table) || !PyTuple_CheckExact(states) ||
                !PyTuple_CheckExact(roles) || PyTuple_GET_SIZE(roles) != 2 ||
                !PyTuple_CheckExact(final) || !PyType_Check(step_type)) {
            PyErr_SetString(PyExc_TypeError, "SessionState(): a misshapen machine");
            return NULL;
        }
        n_states = PyTuple_GET_SIZE(states);
        if (n_states < 2 || PyTuple_GET_SIZE(final) != n_states ||
                PyTuple_GET_SIZE(table) != n_states * n_intents * 2 || initial < 0 ||
                initial >= n_states || n_states > 255) {
            PyErr_SetString(PyExc_ValueError, "SessionState(): a misshapen machine");
            return NULL;
        }
    }
    SessionState *self = (SessionState *)type->tp_alloc(type, 0);
    if (self == NULL)
        return NULL;
    self->decode = Py_NewRef(decode);
    self->encode = Py_NewRef(encode);
    self->message_type = Py_NewRef(message_type);
    self->me = Py_NewRef(me);
    self->peer = Py_NewRef(peer);
    self->protocol = Py_NewRef(protocol);
    self->max_skew = max_skew;
    self->intents = Py_NewRef(intents);
    self->not_understood = self->cancel = -1;
    for (Py_ssize_t i = 0; i < n_intents; i++) {
        PyObject *name = PyObject_GetAttrString(PyTuple_GET_ITEM(intents, i), "value");
        if (name == NULL)
            goto fail;
        if (PyUnicode_CompareWithASCIIString(name, "NOT-UNDERSTOOD") == 0)
            self->not_understood = i;
        else if (PyUnicode_CompareWithASCIIString(name, "CANCEL") == 0)
            self->cancel = i;
        Py_DECREF(name);
    }
    if (ring_init(&self->window, window) < 0 || ring_init(&self->finished, max_open) < 0)
        goto fail;
    self->open = PyDict_New();
    self->ints = PyTuple_New(256);
    if (self->open == NULL || self->ints == NULL)
        goto fail;
    for (Py_ssize_t i = 0; i < 256; i++) {
        PyObject *n = PyLong_FromSsize_t(i);
        if (n == NULL)
            goto fail;
        PyTuple_SET_ITEM(self->ints, i, n);
    }
    self->has_machine = has_machine;
    self->max_open = max_open;
    if (has_machine) {
        self->n_states = n_states;
        self->n_intents = n_intents;
        self->initial = initial;
        self->cancelled = n_states - 1; /* (Machine.states: cancelled last) */
        self->table = PyMem_Calloc((size_t)(n_states * n_intents * 2), sizeof(int));
        self->final = PyMem_Calloc((size_t)n_states, 1);
        if (self->table == NULL || self->final == NULL) {
            PyErr_NoMemory();
            goto fail;
        }
        for (Py_ssize_t i = 0; i < n_states * n_intents * 2; i++) {
            long t = PyLong_AsLong(PyTuple_GET_ITEM(table, i));
            if (t == -1 && PyErr_Occurred())
                goto fail;
            if (t < -1 || t >= n_states) {
                PyErr_SetString(PyExc_ValueError, "SessionState(): a target out of range");
                goto fail;
            }
            self->table[i] = (int)t;
        }
        for (Py_ssize_t i = 0; i < n_states; i++) {
            int f = PyObject_IsTrue(PyTuple_GET_ITEM(final, i));
            if (f < 0)
                goto fail;
            self->final[i] = (unsigned char)f;
        }
        self->states = Py_NewRef(states);
        self->roles = Py_NewRef(roles);
        self->step_type = Py_NewRef(step_type);
        static const char *const fields[] = {"message_id", "intent", "role", "sender",
                                             "before", "after", "finished"};
        self->step_names = PyTuple_New(7);
        self->empty = PyTuple_New(0);
        if (self->step_names == NULL || self->empty == NULL)
            goto fail;
        for (Py_ssize_t i = 0; i < 7; i++) {
            PyObject *name = PyUnicode_InternFromString(fields[i]);
            if (name == NULL)
                goto fail;
            PyTuple_SET_ITEM(self->step_names, i, name);
        }
    }
    return (PyObject *)self;
fail:
    Py_DECREF(self);
    return NULL;
}

static int
ss_traverse(SessionState *self, visitproc visit, void *arg)
{
    Py_VISIT(Py_TYPE(self));
    Py_VISIT(self->decode);
    Py_VISIT(self->encode);
    Py_VISIT(self->message_type);
    Py_VISIT(self->me);
    Py_VISIT(self->peer);
    Py_VISIT(self->protocol);
    Py_VISIT(self->intents);
    Py_VISIT(self->states);
    Py_VISIT(self->roles);
    Py_VISIT(self->step_type);
    Py_VISIT(self->step_names);
    Py_VISIT(self->open);
    Py_VISIT(self->ints);
    int r;
    if ((r = ring_traverse(&self->window, visit, arg)) != 0 ||
            (r = ring_traverse(&self->finished, visit, arg)) != 0)
        return r;
    return 0;
}

static int
ss_clear(SessionState *self)
{
    Py_CLEAR(self->decode);
    Py_CLEAR(self->encode);
    Py_CLEAR(self->message_type);
    Py_CLEAR(self->me);
    Py_CLEAR(self->peer);
    Py_CLEAR(self->protocol);
    Py_CLEAR(self->intents);
    Py_CLEAR(self->states);
    Py_CLEAR(self->roles);
    Py_CLEAR(self->step_type);
    Py_CLEAR(self->step_names);
    Py_CLEAR(self->empty);
    Py_CLEAR(self->open);
    Py_CLEAR(self->ints);
    ring_clear(&self->window);
    ring_clear(&self->finished);
    return 0;
}

static void
ss_dealloc(SessionState *self)
{
    PyTypeObject *type = Py_TYPE(self);
    PyObject_GC_UnTrack(self);
    ss_clear(self);
    ring_free(&self->window);
    ring_free(&self->finished);
    PyMem_Free(self->table);
    PyMem_Free(self->final);
    type->tp_free((PyObject *)self);
    Py_DECREF(type);
}

/* a is b, or a == b: 1, 0, or -1 with an exception. */
static int
same(PyObject *a, PyObject *b)
{
    return a == b ? 1 : PyObject_RichCompareBool(a, b, Py_EQ);
}

/* A field of a message just decoded (its only holder: the caller) that equals the
 * session's own object `ours` (checked: same()) is made that very object. What reads the
 * message next — a handler's reply built from its parties, this state's send() of that
 * reply — then compares by identity, not by calling the atoms' Python __eq__ (the
 * decoder makes new URI objects for every frame's parties). */
static void
adopt(PyObject **field, PyObject *ours)
{
    if (*field != ours && Py_TYPE(*field) == Py_TYPE(ours))
        Py_SETREF(*field, Py_NewRef(ours));
}

/* What a message does to its conversation, planned before anything changes. */
typedef struct {
    PyObject *thread; /* borrowed; NULL: a new conversation */
    Py_ssize_t intent, role, before, after;
} Plan;

/* Plan m's step (from_peer: the peer sent it): 1, 0 (refused: the reference judges), or
 * -1 with an exception. The checks of ConversationTracker._route and Conversation.check,
 * for a session's two parties (checked already) and a machine without stateful rules. */
static int
plan_step(SessionState *s, MessageFieldsObject *m, long long now, int from_peer, Plan *p)
{
    PyObject *cid = m->conversation_id;
    if (!PyUnicode_CheckExact(cid) || !PyUnicode_CheckExact(m->message_id))
        return 0;
    int r = same(m->protocol, s->protocol);
    if (r <= 0)
        return r;
    PyObject *thread = PyDict_GetItemWithError(s->open, cid);
    Py_ssize_t role, state, i = p->intent;
    if (thread == NULL) {
        if (PyErr_Occurred())
            return -1;
        r = PySet_Contains(s->finished.set, cid);
        if (r != 0)
            return r < 0 ? -1 : 0; /* (the conversation has finished) */
        if (PyDict_GET_SIZE(s->open) >= s->max_open || i == s->cancel ||
                m->in_reply_to != Py_None)
            return 0;
        role = 0;
        state = s->initial;
    }
    else {
        if (!PyList_CheckExact(thread) || PyList_GET_SIZE(thread) != T_SIZE)
            return 0;
        role = (PyList_GET_ITEM(thread, T_STARTER) == Py_True) == from_peer ? 0 : 1;
        state = PyLong_AsSsize_t(PyList_GET_ITEM(thread, T_STATE));
        if (state < 0 || state >= s->n_states)
            return PyErr_Occurred() ? -1 : 0;
        PyObject *seen = PyList_GET_ITEM(thread, T_SEEN);
        r = PyDict_Contains(seen, m->message_id);
        if (r != 0)
            return r < 0 ? -1 : 0;
        if (m->in_reply_to != Py_None) {
            PyObject *replied = PyDict_GetItemWithError(seen, m->in_reply_to);
            if (replied == NULL)
                return PyErr_Occurred() ? -1 : 0;
            if (PyLong_AsSsize_t(replied) == role)
                return 0;
        }
    }
    Py_ssize_t target;
    if (i == s->cancel)
        target = role == 0 && !s->final[state] ? s->cancelled : -1;
    else
        target = s->table[(state * s->n_intents + i) * 2 + role];
    if (target < 0)
        return 0;
    if (thread != NULL && i != s->cancel) {
        PyObject *deadline = PyList_GET_ITEM(thread, T_DEADLINE);
        if (deadline != Py_None &&
                PyLong_AsSsize_t(PyList_GET_ITEM(thread, T_AWAITED)) == role) {
            int overflow = 0;
            long long due = PyLong_AsLongLongAndOverflow(deadline, &overflow);
            if (due == -1 && PyErr_Occurred())
                return -1;
            if (overflow || now > due)
                return 0;
        }
    }
    p->thread = thread;
    p->role = role;
    p->before = state;
    p->after = target;
    return 1;
}

#define INT(s, n) PyTuple_GET_ITEM((s)->ints, (n))

/* Take planned step p of m: the Step (new reference), or NULL with an exception. */
static PyObject *
take_step(SessionState *s, MessageFieldsObject *m, Plan *p, int from_peer)
{
    PyObject *thread = p->thread;
    if (thread == NULL) {
        PyObject *seen = PyDict_New(), *history = PyList_New(0);
        thread = PyList_New(T_SIZE);
        if (seen == NULL || history == NULL || thread == NULL) {
            Py_XDECREF(seen);
            Py_XDECREF(history);
            Py_XDECREF(thread);
            return NULL;
        }
        PyList_SET_ITEM(thread, T_STARTER, Py_NewRef(from_peer ? Py_True : Py_False));
        PyList_SET_ITEM(thread, T_STATE, Py_NewRef(INT(s, s->initial)));
        PyList_SET_ITEM(thread, T_SEEN, seen);
        PyList_SET_ITEM(thread, T_DEADLINE, Py_NewRef(Py_None));
        PyList_SET_ITEM(thread, T_AWAITED, Py_NewRef(INT(s, 0)));
        PyList_SET_ITEM(thread, T_HISTORY, history);
        int failed = PyDict_SetItem(s->open, m->conversation_id, thread);
        Py_DECREF(thread); /* (the dict's now) */
        if (failed < 0)
            return NULL;
    }
    if (PyDict_SetItem(PyList_GET_ITEM(thread, T_SEEN), m->message_id, INT(s, p->role)) < 0)
        return NULL;
    int final = s->final[p->after];
    if (m->reply_by != Py_None && !final) {
        if (PyList_SetItem(thread, T_DEADLINE, Py_NewRef(m->reply_by)) < 0 ||
                PyList_SetItem(thread, T_AWAITED, Py_NewRef(INT(s, 1 - p->role))) < 0)
            return NULL;
    }
    else if (PyList_GET_ITEM(thread, T_DEADLINE) != Py_None &&
             PyLong_AsSsize_t(PyList_GET_ITEM(thread, T_AWAITED)) == p->role) {
        if (PyList_SetItem(thread, T_DEADLINE, Py_NewRef(Py_None)) < 0)
            return NULL;
    }
    if (PyList_SetItem(thread, T_STATE, Py_NewRef(INT(s, p->after))) < 0)
        return NULL;
    PyObject *stack[7] = {m->message_id, m->intent, PyTuple_GET_ITEM(s->roles, p->role),
                          m->sender, PyTuple_GET_ITEM(s->states, p->before),
                          PyTuple_GET_ITEM(s->states, p->after), final ? Py_True : Py_False};
    /* The Step made as Message._trusted makes a Message: object.__new__ and each field set
     * past the frozen dataclass's __setattr__ (its __init__ would only check nothing and
     * set the same seven, in a Python frame). */
    PyObject *step = PyBaseObject_Type.tp_new((PyTypeObject *)s->step_type, s->empty,
                                              NULL);
    if (step == NULL)
        return NULL;
    for (Py_ssize_t k = 0; k < 7; k++)
        if (PyObject_GenericSetAttr(step, PyTuple_GET_ITEM(s->step_names, k), stack[k]) < 0)
            goto fail;
    if (PyList_Append(PyList_GET_ITEM(thread, T_HISTORY), step) < 0)
        goto fail;
    if (final) { /* forgotten, its id kept among the finished */
        PyObject *cid = Py_NewRef(m->conversation_id);
        int failed = PyDict_DelItem(s->open, cid) < 0 || ring_push(&s->finished, cid) < 0;
        Py_DECREF(cid);
        if (failed)
            goto fail;
    }
    return step;
fail:
    Py_DECREF(step);
    return NULL;
}

/* The index of m's intent in the table's order, or -1 (NOT-UNDERSTOOD among them). */
static Py_ssize_t
intent_index(SessionState *s, PyObject *intent)
{
    for (Py_ssize_t i = 0; i < PyTuple_GET_SIZE(s->intents); i++)
        if (PyTuple_GET_ITEM(s->intents, i) == intent)
            return i == s->not_understood ? -1 : i;
    return -1;
}

static int
now_of(PyObject *const *args, Py_ssize_t nargs, long long *now)
{
    if (nargs != 2 || !PyLong_CheckExact(args[1])) {
        PyErr_SetString(PyExc_TypeError, "expected (data, now: int)");
        return -1;
    }
    *now = PyLong_AsLongLong(args[1]);
    return *now == -1 && PyErr_Occurred() ? -1 : 0;
}

#define DECLINE(code) do { result = PyLong_FromLong(code); goto done; } while (0)

/* receive(frame, now) -> (Message, Step | None) | int: frame (bytes, its length prefix
 * cut) decoded, through pass 2 and the schema, from the peer to this side, fresh, not a
 * replay, and allowed by its conversation; the state then holds it. An int (a refusal
 * code) where anything is refused or doubtful, and nothing has changed. */
static PyObject *
ss_receive(SessionState *self, PyObject *const *args, Py_ssize_t nargs)
{
    long long now;
    if (now_of(args, nargs, &now) < 0)
        return NULL;
    if (!PyBytes_CheckExact(args[0])) {
        PyErr_SetString(PyExc_TypeError, "receive(data: bytes, now: int)");
        return NULL;
    }
    PyObject *message = PyObject_Vectorcall(self->decode, args, 1, NULL);
    if (message == NULL) {
        if (!PyErr_ExceptionMatches(PyExc_Exception))
            return NULL;
        PyErr_Clear();
        return PyLong_FromLong(SS_DECODE);
    }
    PyObject *result = NULL, *step = NULL;
    if ((PyObject *)Py_TYPE(message) != self->message_type)
        DECLINE(SS_DECODE);
    MessageFieldsObject *m = (MessageFieldsObject *)message;
    Plan plan = {NULL, intent_index(self, m->intent), 0, 0, 0};
    if (plan.intent < 0)
        DECLINE(SS_INTENT);
    int r = same(m->sender, self->peer);
    if (r > 0)
        r = same(m->receiver, self->me);
    if (r <= 0) {
        if (r < 0)
            goto done;
        DECLINE(SS_PARTIES);
    }
    if (!PyLong_CheckExact(m->timestamp))
        DECLINE(SS_STALE);
    int overflow = 0;
    long long stamp = PyLong_AsLongLongAndOverflow(m->timestamp, &overflow);
    if (stamp == -1 && PyErr_Occurred())
        goto done;
    unsigned long long skew = stamp >= now ? (unsigned long long)stamp - (unsigned long long)now
                                           : (unsigned long long)now - (unsigned long long)stamp;
    if (overflow || skew > (unsigned long long)self->max_skew)
        DECLINE(SS_STALE);
    if (!PyUnicode_CheckExact(m->message_id))
        DECLINE(SS_DECODE);
    r = PySet_Contains(self->window.set, m->message_id);
    if (r != 0) {
        if (r < 0)
            goto done;
        DECLINE(SS_REPLAY);
    }
    if (self->has_machine) {
        r = plan_step(self, m, now, 1, &plan);
        if (r <= 0) {
            if (r < 0)
                goto done;
            DECLINE(SS_CONVERSATION);
        }
    }
    /* every check has passed: only now does anything change */
    if (ring_push(&self->window, m->message_id) < 0)
        goto done;
    if (Py_REFCNT(message) == 1) { /* (nobody else holds it: equal objects swapped) */
        adopt(&m->sender, self->peer);
        adopt(&m->receiver, self->me);
        if (self->has_machine) /* (plan_step found the protocol equal) */
            adopt(&m->protocol, self->protocol);
    }
    if (self->has_machine) {
        step = take_step(self, m, &plan, 1);
        if (step == NULL)
            goto done;
    }
    else
        step = Py_NewRef(Py_None);
    result = PyTuple_Pack(2, message, step);
done:
    Py_XDECREF(step);
    Py_DECREF(message);
    return result;
}

/* send(message, now) -> (bytes, Step | None) | int: message (a Message from this side to
 * the peer, checked by the caller as its protocol requires) allowed by its conversation,
 * encoded and framed; the state then holds it. An int (a refusal code) where anything is
 * refused or doubtful, and nothing has changed; an exception the encoder raised. */
static PyObject *
ss_send(SessionState *self, PyObject *const *args, Py_ssize_t nargs)
{
    long long now;
    if (now_of(args, nargs, &now) < 0)
        return NULL;
    PyObject *message = args[0];
    if ((PyObject *)Py_TYPE(message) != self->message_type)
        return PyLong_FromLong(SS_DECODE);
    MessageFieldsObject *m = (MessageFieldsObject *)message;
    Plan plan = {NULL, intent_index(self, m->intent), 0, 0, 0};
    if (plan.intent < 0)
        return PyLong_FromLong(SS_INTENT);
    int r = same(m->sender, self->me);
    if (r > 0)
        r = same(m->receiver, self->peer);
    if (r <= 0)
        return r < 0 ? NULL : PyLong_FromLong(SS_PARTIES);
    if (self->has_machine) {
        r = plan_step(self, m, now, 0, &plan);
        if (r <= 0)
            return r < 0 ? NULL : PyLong_FromLong(SS_CONVERSATION);
    }
    PyObject *encoded = PyObject_Vectorcall(self->encode, args, 1, NULL);
    if (encoded == NULL)
        return NULL;
    PyObject *result = NULL, *step = NULL, *framed = NULL;
    if (!PyBytes_CheckExact(encoded) || PyBytes_GET_SIZE(encoded) < 1 ||
            (unsigned long long)PyBytes_GET_SIZE(encoded) > 0xffffffffULL) {
        result = PyLong_FromLong(SS_FRAME);
        goto done;
    }
    Py_ssize_t size = PyBytes_GET_SIZE(encoded);
    framed = PyBytes_FromStringAndSize(NULL, size + 4);
    if (framed == NULL)
        goto done;
    unsigned char *out = (unsigned char *)PyBytes_AS_STRING(framed);
    out[0] = (unsigned char)(size >> 24);
    out[1] = (unsigned char)(size >> 16);
    out[2] = (unsigned char)(size >> 8);
    out[3] = (unsigned char)size;
    memcpy(out + 4, PyBytes_AS_STRING(encoded), (size_t)size);
    if (self->has_machine) {
        step = take_step(self, m, &plan, 0);
        if (step == NULL)
            goto done;
    }
    else
        step = Py_NewRef(Py_None);
    result = PyTuple_Pack(2, framed, step);
done:
    Py_XDECREF(step);
    Py_XDECREF(framed);
    Py_DECREF(encoded);
    return result;
}

/* threads() -> list of (conversation id, started by the peer, state index, {message id:
 * role index}, reply-by or None, awaited role index, [Step, …]): the open conversations,
 * oldest first (copies). */
static PyObject *
ss_threads(SessionState *self, PyObject *Py_UNUSED(ignored))
{
    PyObject *list = PyList_New(0), *cid, *thread;
    Py_ssize_t pos = 0;
    if (list == NULL)
        return NULL;
    while (PyDict_Next(self->open, &pos, &cid, &thread)) {
        PyObject *seen = PyDict_Copy(PyList_GET_ITEM(thread, T_SEEN));
        PyObject *history = seen == NULL ? NULL
            : PyList_GetSlice(PyList_GET_ITEM(thread, T_HISTORY), 0, PY_SSIZE_T_MAX);
        PyObject *item = history == NULL ? NULL : PyTuple_Pack(
            7, cid, PyList_GET_ITEM(thread, T_STARTER), PyList_GET_ITEM(thread, T_STATE),
            seen, PyList_GET_ITEM(thread, T_DEADLINE), PyList_GET_ITEM(thread, T_AWAITED),
            history);
        Py_XDECREF(seen);
        Py_XDECREF(history);
        if (item == NULL || PyList_Append(list, item) < 0) {
            Py_XDECREF(item);
            Py_DECREF(list);
            return NULL;
        }
        Py_DECREF(item);
    }
    return list;
}

static PyObject *
ss_window(SessionState *self, PyObject *Py_UNUSED(ignored))
{
    return ring_list(&self->window);
}

static PyObject *
ss_finished(SessionState *self, PyObject *Py_UNUSED(ignored))
{
    return ring_list(&self->finished);
}

/* load(window, threads, finished): replace the state by these (the forms window(),
 * threads() and finished() give). */
static PyObject *
ss_load(SessionState *self, PyObject *args)
{
    PyObject *window, *threads, *finished;
    if (!PyArg_ParseTuple(args, "O!O!O!:load", &PyList_Type, &window, &PyList_Type,
                          &threads, &PyList_Type, &finished))
        return NULL;
    PyObject *open = PyDict_New();
    if (open == NULL)
        return NULL;
    for (Py_ssize_t i = 0; i < PyList_GET_SIZE(threads); i++) {
        PyObject *t = PyList_GET_ITEM(threads, i);
        PyObject *cid, *starter, *state, *seen, *deadline, *awaited, *history;
        if (!PyArg_ParseTuple(t, "UO!O!O!OO!O!:load", &cid, &PyBool_Type, &starter,
                              &PyLong_Type, &state, &PyDict_Type, &seen, &deadline,
                              &PyLong_Type, &awaited, &PyList_Type, &history))
            goto fail;
        Py_ssize_t index = PyLong_AsSsize_t(state), role = PyLong_AsSsize_t(awaited);
        if (index < 0 || index >= self->n_states || role < 0 || role > 1 ||
                (deadline != Py_None && !PyLong_CheckExact(deadline))) {
            if (!PyErr_Occurred())
                PyErr_SetString(PyExc_ValueError, "load(): a thread out of range");
            goto fail;
        }
        PyObject *copy = PyDict_Copy(seen);
        PyObject *list = copy == NULL ? NULL : PyList_GetSlice(history, 0, PY_SSIZE_T_MAX);
        PyObject *thread = list == NULL ? NULL : PyList_New(T_SIZE);
        if (thread == NULL) {
            Py_XDECREF(copy);
            Py_XDECREF(list);
            goto fail;
        }
        PyList_SET_ITEM(thread, T_STARTER, Py_NewRef(starter));
        PyList_SET_ITEM(thread, T_STATE, Py_NewRef(INT(self, index)));
        PyList_SET_ITEM(thread, T_SEEN, copy);
        PyList_SET_ITEM(thread, T_DEADLINE, Py_NewRef(deadline));
        PyList_SET_ITEM(thread, T_AWAITED, Py_NewRef(INT(self, role)));
        PyList_SET_ITEM(thread, T_HISTORY, list);
        int failed = PyDict_SetItem(open, cid, thread);
        Py_DECREF(thread);
        if (failed < 0)
            goto fail;
    }
    if (ring_load(&self->window, window) < 0 || ring_load(&self->finished, finished) < 0)
        goto fail;
    Py_SETREF(self->open, open);
    Py_RETURN_NONE;
fail:
    Py_DECREF(open);
    return NULL;
}

static PyMethodDef ss_methods[] = {
    {"receive", (PyCFunction)(void (*)(void))ss_receive, METH_FASTCALL,
     "receive(frame, now) -> (Message, Step | None) | int: a frame received, checked and "
     "taken, or a refusal code (nothing changed: the reference judges it)."},
    {"send", (PyCFunction)(void (*)(void))ss_send, METH_FASTCALL,
     "send(message, now) -> (bytes, Step | None) | int: a message stepped, encoded and "
     "framed, or a refusal code (nothing changed: the reference judges it)."},
    {"threads", (PyCFunction)ss_threads, METH_NOARGS,
     "threads() -> list: the open conversations (see the module's comment)."},
    {"window", (PyCFunction)ss_window, METH_NOARGS,
     "window() -> list[str]: the replay window's ids, oldest first."},
    {"finished", (PyCFunction)ss_finished, METH_NOARGS,
     "finished() -> list[str]: the finished conversations' ids kept, oldest first."},
    {"load", (PyCFunction)ss_load, METH_VARARGS,
     "load(window, threads, finished): replace the state (the forms of window(), "
     "threads(), finished())."},
    {NULL, NULL, 0, NULL},
};

static PyType_Slot ss_slots[] = {
    {Py_tp_doc, "SessionState(*, decode, encode, message_type, me, peer, protocol, "
                "max_skew_ms, replay_window, table, intents, states, roles, final, initial, "
                "step_type, max_open): an established session's per-message state "
                "(cbcl.session._session.Session makes it)."},
    {Py_tp_new, ss_new},
    {Py_tp_traverse, ss_traverse},
    {Py_tp_clear, ss_clear},
    {Py_tp_dealloc, ss_dealloc},
    {Py_tp_methods, ss_methods},
    {0, NULL},
};

static PyType_Spec ss_spec = {
    .name = "cbcl._native.SessionState",
    .basicsize = sizeof(SessionState),
    .flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_HAVE_GC | Py_TPFLAGS_IMMUTABLETYPE,
    .slots = ss_slots,
};

int
cbcl_session_exec(PyObject *module, NativeState *Py_UNUSED(st))
{
    PyObject *type = PyType_FromModuleAndSpec(module, &ss_spec, NULL);
    if (type == NULL)
        return -1;
    int r = PyModule_AddObjectRef(module, "SessionState", type);
    Py_DECREF(type);
    return r;
}
