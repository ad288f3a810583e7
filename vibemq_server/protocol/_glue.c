/* A frame's few small pieces glued into one bytes object, in one call (protocol/codec.py; the
 * pure equivalent is b"".join of the pieces).
 *
 * Every native publish is answered with a PublishAck of nine pieces (constant bytes around two
 * echoes of its id and queue), every delivery is a Deliver of six. From the compiled codec
 * b"".join((...)) builds a tuple, then walks it generically and takes and releases a buffer of
 * each piece: ~1,000 instructions a PublishAck. Here the pieces come as the call's arguments
 * (vectorcall: no tuple), each an exact bytes object, summed and copied: a few hundred.
 *
 * glue(*parts) -> bytes: the parts joined, as b"".join(parts) (which it calls when a part is
 * not exactly bytes: a bytearray, a memoryview).
 *
 * publish_ack(msg_id, queue) -> bytes | None: the whole PublishAck frame, written in place,
 * when id and queue are ASCII (their UTF-8 is the str's own storage: no encode either); None
 * otherwise (the codec glues it from its pieces then).
 *
 * publish_acks(echoes) -> bytes | None: the PublishAcks of a list [id, queue, id, queue, ...]
 * one after the other in one bytes object (a durable group commit's answers: one allocation,
 * not a frame each and their join); None when any of them is not ASCII.
 *
 * deliver(msg_id, piece, payload, tail) -> bytes | None: the whole Deliver frame of an ASCII id
 * (the queue's length-prefixed piece, the payload and the headers' tail as bytes), written in
 * place; None for any other id or argument (the codec glues it from its pieces then).
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <string.h>

/* b"".join(args): for parts of other buffer types (a bytearray, a memoryview). */
static PyObject *join_any(PyObject *const *args, Py_ssize_t nargs) {
    PyObject *parts = PyTuple_New(nargs);
    if (parts == NULL)
        return NULL;
    for (Py_ssize_t i = 0; i < nargs; i++)
        PyTuple_SET_ITEM(parts, i, Py_NewRef(args[i]));
    PyObject *empty = PyBytes_FromStringAndSize(NULL, 0);
    PyObject *out = empty == NULL ? NULL : PyObject_CallMethod(empty, "join", "(O)", parts);
    Py_XDECREF(empty);
    Py_DECREF(parts);
    return out;
}

static PyObject *glue(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
    (void)self;
    Py_ssize_t total = 0;
    for (Py_ssize_t i = 0; i < nargs; i++) {
        if (!PyBytes_CheckExact(args[i]))
            return join_any(args, nargs);
        Py_ssize_t n = PyBytes_GET_SIZE(args[i]);
        if (n > PY_SSIZE_T_MAX - total)
            return PyErr_NoMemory();
        total += n;
    }
    PyObject *out = PyBytes_FromStringAndSize(NULL, total);
    if (out == NULL)
        return NULL;
    char *p = PyBytes_AS_STRING(out);
    for (Py_ssize_t i = 0; i < nargs; i++) {
        Py_ssize_t n = PyBytes_GET_SIZE(args[i]);
        memcpy(p, PyBytes_AS_STRING(args[i]), (size_t)n);
        p += n;
    }
    return out;
}

/* An ASCII str's bytes and length (its UTF-8, as it is stored); 0 for any other str (or not a
 * str, or longer than a u16 length says). */
static int ascii_text(PyObject *o, const char **data, Py_ssize_t *n) {
    if (!PyUnicode_CheckExact(o) || !PyUnicode_IS_COMPACT_ASCII(o))
        return 0;
    *n = PyUnicode_GET_LENGTH(o);
    *data = (const char *)PyUnicode_DATA(o);
    return *n <= 0xFFFF;
}

static char *put_u16(char *p, Py_ssize_t v) {
    p[0] = (char)(v >> 8);
    p[1] = (char)v;
    return p + 2;
}

static char *put_text(char *p, const char *data, Py_ssize_t n) {
    p = put_u16(p, n);
    memcpy(p, data, (size_t)n);
    return p + n;
}

/* A frame's head at `at`: the length of its ``body``, version 1, ``type`` and the id; its end. */
static char *put_head(char *at, Py_ssize_t body, char type, const char *id, Py_ssize_t n) {
    at = put_u16(at, body >> 16);
    at = put_u16(at, body & 0xFFFF);
    *at++ = 1;
    *at++ = type;
    return put_text(at, id, n);
}

/* A new frame of ``body`` bytes after its length: the length, version 1, ``type`` and the id
 * written, ``*p`` where the rest goes; NULL when out of memory. */
static PyObject *new_frame(Py_ssize_t body, char type, const char *id, Py_ssize_t n, char **p) {
    PyObject *out = PyBytes_FromStringAndSize(NULL, 4 + body);
    if (out == NULL)
        return NULL;
    *p = put_head(PyBytes_AS_STRING(out), body, type, id, n);
    return out;
}

static const char MESSAGE_ID_KEY[] = "\x00\x09messageId";
static const char QUEUE_NAME_KEY[] = "\x00\x09queueName";
#define KEY_SIZE 11

/* The PublishAck's size after its length prefix. Body: version 1, type 21, the id, the queue,
 * an empty payload, two headers: messageId = the id, queueName = the queue. */
#define PUBLISH_ACK_BODY(n, q) (2 + 2 + (n) + 2 + (q) + 4 + 2 + KEY_SIZE + 2 + (n) + KEY_SIZE + 2 + (q))

/* Write the PublishAck of `id` and `queue` at `p` (4 + PUBLISH_ACK_BODY bytes); its end. */
static char *put_publish_ack(char *p, const char *id, Py_ssize_t n, const char *queue,
                             Py_ssize_t q) {
    p = put_head(p, PUBLISH_ACK_BODY(n, q), 21, id, n);
    p = put_text(p, queue, q);
    memset(p, 0, 4); /* the payload's length */
    p = put_u16(p + 4, 2);
    memcpy(p, MESSAGE_ID_KEY, KEY_SIZE);
    p = put_text(p + KEY_SIZE, id, n);
    memcpy(p, QUEUE_NAME_KEY, KEY_SIZE);
    return put_text(p + KEY_SIZE, queue, q);
}

/* The PublishAck frame of a Publish whose id and queue are ASCII (the usual case); None for
 * any other, which the codec then builds from its pieces. */
static PyObject *publish_ack(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
    (void)self;
    const char *id, *queue;
    Py_ssize_t n, q;
    if (nargs != 2) {
        PyErr_SetString(PyExc_TypeError, "publish_ack takes 2 arguments");
        return NULL;
    }
    if (!ascii_text(args[0], &id, &n) || !ascii_text(args[1], &queue, &q))
        Py_RETURN_NONE;
    PyObject *out = PyBytes_FromStringAndSize(NULL, 4 + PUBLISH_ACK_BODY(n, q));
    if (out == NULL)
        return NULL;
    put_publish_ack(PyBytes_AS_STRING(out), id, n, queue, q);
    return out;
}

/* The PublishAcks of a list of id, queue, id, queue, ... in one bytes object: sized in a
 * first pass (which checks that every one is ASCII), written in a second (nothing between
 * the two runs Python code: the list cannot change). */
static PyObject *publish_acks(PyObject *self, PyObject *echoes) {
    (void)self;
    if (!PyList_CheckExact(echoes) || PyList_GET_SIZE(echoes) % 2 != 0) {
        PyErr_SetString(PyExc_TypeError, "publish_acks takes a list of id, queue, ...");
        return NULL;
    }
    Py_ssize_t count = PyList_GET_SIZE(echoes), total = 0;
    const char *id, *queue;
    Py_ssize_t n, q;
    for (Py_ssize_t i = 0; i < count; i += 2) {
        if (!ascii_text(PyList_GET_ITEM(echoes, i), &id, &n) ||
            !ascii_text(PyList_GET_ITEM(echoes, i + 1), &queue, &q))
            Py_RETURN_NONE;
        if (total > PY_SSIZE_T_MAX / 2)
            return PyErr_NoMemory();
        total += 4 + PUBLISH_ACK_BODY(n, q);
    }
    PyObject *out = PyBytes_FromStringAndSize(NULL, total);
    if (out == NULL)
        return NULL;
    char *p = PyBytes_AS_STRING(out);
    for (Py_ssize_t i = 0; i < count; i += 2) {
        ascii_text(PyList_GET_ITEM(echoes, i), &id, &n);
        ascii_text(PyList_GET_ITEM(echoes, i + 1), &queue, &q);
        p = put_publish_ack(p, id, n, queue, q);
    }
    return out;
}

/* The Deliver frame: version 1, type 26, the id, the queue's piece (its u16 length and name,
 * as the codec caches it), the payload's u32 length, the payload, the headers' tail (their count
 * and pairs). The pieces are exact bytes whose sizes are their own: nothing read past them. */
static PyObject *deliver(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
    (void)self;
    const char *id;
    Py_ssize_t n;
    if (nargs != 4) {
        PyErr_SetString(PyExc_TypeError, "deliver takes 4 arguments");
        return NULL;
    }
    PyObject *piece = args[1], *payload = args[2], *tail = args[3];
    if (!ascii_text(args[0], &id, &n) || !PyBytes_CheckExact(piece) ||
        !PyBytes_CheckExact(payload) || !PyBytes_CheckExact(tail))
        Py_RETURN_NONE;
    Py_ssize_t q = PyBytes_GET_SIZE(piece), plen = PyBytes_GET_SIZE(payload);
    Py_ssize_t t = PyBytes_GET_SIZE(tail);
    if (plen > 0xFFFFFFFFLL - 8 - q - t - n)
        Py_RETURN_NONE; /* (a frame's length is a u32: the codec's own checks say so) */
    Py_ssize_t body = 2 + 2 + n + q + 4 + plen + t;
    char *p;
    PyObject *out = new_frame(body, 26, id, n, &p);
    if (out == NULL)
        return NULL;
    memcpy(p, PyBytes_AS_STRING(piece), (size_t)q);
    p += q;
    p = put_u16(p, plen >> 16);
    p = put_u16(p, plen & 0xFFFF);
    memcpy(p, PyBytes_AS_STRING(payload), (size_t)plen);
    memcpy(p + plen, PyBytes_AS_STRING(tail), (size_t)t);
    return out;
}

static PyMethodDef methods[] = {
    {"glue", (PyCFunction)(void (*)(void))glue, METH_FASTCALL,
     "glue(*parts) -> bytes: the parts joined, as b\"\".join(parts)."},
    {"publish_ack", (PyCFunction)(void (*)(void))publish_ack, METH_FASTCALL,
     "publish_ack(msg_id, queue) -> bytes | None: the PublishAck frame when both are ASCII."},
    {"publish_acks", (PyCFunction)publish_acks, METH_O,
     "publish_acks(echoes) -> bytes | None: the PublishAcks of [id, queue, ...] when all ASCII."},
    {"deliver", (PyCFunction)(void (*)(void))deliver, METH_FASTCALL,
     "deliver(msg_id, piece, payload, tail) -> bytes | None: the Deliver frame of an ASCII id."},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {
    PyModuleDef_HEAD_INIT, "_glue", "A frame's small pieces joined in one call.", -1, methods,
};

PyMODINIT_FUNC PyInit__glue(void) { return PyModule_Create(&module); }
