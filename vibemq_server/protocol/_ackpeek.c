/* The target of the usual native Ack read in one C call (protocol/codec.py: peek_ack_target).
 *
 * Half of a native stream's frames are Acks, and the session only needs the id each settles:
 * the one ``messageId`` header's value. The Python peek walks the body byte by byte, slices the
 * header's key and value and decodes the value (~1,300 instructions an Ack compiled); here the
 * lengths are read and checked against the body's size and the value copied into an ASCII str.
 *
 * ack_target(body) -> str | None: for an Ack body of version 1 with a non-empty own id, one
 * header, ``messageId``, whose value is non-empty and ends the body, and whose own id, queue and
 * value are ASCII, that value; None for anything else (the codec's own peek decides then). The
 * limits (how many headers, how long a value) are the caller's to check.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <string.h>

#define PROTOCOL_VERSION 1
#define ACK 30

static const char MESSAGE_ID_KEY[] = "\x00\x09messageId";
#define KEY_SIZE 11

static int all_ascii(const unsigned char *p, Py_ssize_t n) {
    unsigned char bits = 0;
    for (Py_ssize_t i = 0; i < n; i++)
        bits |= p[i];
    return bits < 0x80;
}

static Py_ssize_t u16(const unsigned char *p) { return (Py_ssize_t)p[0] << 8 | p[1]; }

static PyObject *ack_target(PyObject *self, PyObject *arg) {
    (void)self;
    if (!PyBytes_CheckExact(arg))
        Py_RETURN_NONE;
    const unsigned char *b = (const unsigned char *)PyBytes_AS_STRING(arg);
    Py_ssize_t size = PyBytes_GET_SIZE(arg);
    /* Every length is checked against what is left before it is used: ``left`` never goes
     * negative and nothing past ``size`` is read. */
    if (size < 6 || b[0] != PROTOCOL_VERSION || b[1] != ACK)
        Py_RETURN_NONE;
    Py_ssize_t own = u16(b + 2);
    if (own == 0 || own > size - 6) /* the id, then the queue's length */
        Py_RETURN_NONE;
    const unsigned char *own_id = b + 4;
    Py_ssize_t pos = 4 + own;
    Py_ssize_t queue = u16(b + pos);
    pos += 2;
    if (queue > size - pos - 4) /* the queue, then the payload's length */
        Py_RETURN_NONE;
    const unsigned char *queue_name = b + pos;
    pos += queue;
    size_t plen = (size_t)b[pos] << 24 | (size_t)b[pos + 1] << 16 | (size_t)b[pos + 2] << 8 |
                  (size_t)b[pos + 3];
    pos += 4;
    if (plen > (size_t)(size - pos) || (Py_ssize_t)plen > size - pos - 2 - KEY_SIZE - 2)
        Py_RETURN_NONE; /* the payload, then the count, the key and the value's length */
    pos += (Py_ssize_t)plen;
    if (u16(b + pos) != 1 || memcmp(b + pos + 2, MESSAGE_ID_KEY, KEY_SIZE) != 0)
        Py_RETURN_NONE;
    pos += 2 + KEY_SIZE;
    Py_ssize_t n = u16(b + pos);
    pos += 2;
    if (n == 0 || n != size - pos)
        Py_RETURN_NONE;
    if (!all_ascii(own_id, own) || !all_ascii(queue_name, queue) || !all_ascii(b + pos, n))
        Py_RETURN_NONE;
    PyObject *target = PyUnicode_New(n, 127);
    if (target == NULL)
        return NULL;
    memcpy(PyUnicode_DATA(target), b + pos, (size_t)n);
    return target;
}

static PyMethodDef methods[] = {
    {"ack_target", ack_target, METH_O,
     "ack_target(body) -> str | None: the messageId of the usual ASCII Ack body."},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {
    PyModuleDef_HEAD_INIT, "_ackpeek", "The target of the usual native Ack in one call.", -1,
    methods,
};

PyMODINIT_FUNC PyInit__ackpeek(void) { return PyModule_Create(&module); }
