/* Join a byte range of a list of buffers into one bytes object, with the GIL released for the
 * copy: a decoder's one copy of a 64 MiB payload (about 50 ms here, page faults included) can
 * then run in a worker thread while the event loop serves the other connections
 * (vibemq_server/protocol/bigcopy.py; the pure equivalent is held.join_range).
 *
 * The buffers are exported (PyObject_GetBuffer) before the GIL is released and released after
 * it is taken back, so their memory stays put whatever other threads do meanwhile.
 *
 * ReadBuffer: the socket read straight into a fresh bytes object (server/transport.py's
 * get_buffer / buffer_updated), which is then cut to what was read and handed on: the read
 * costs no user-space copy. uvloop's own read path copies every read out of its 256 KiB
 * buffer into a new bytes (about half the broker's memmove with 64 KiB MQTT payloads).
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <string.h>

#include "../_cext/common.h"

/* below this the GIL's release and re-take costs more than it lets others do */
#define NOGIL_FROM (64 * 1024)

/* Copy bytes start:stop of the exported buffers to dst (no Python calls: runs without the GIL). */
static void copy_range(const Py_buffer *views, Py_ssize_t count, Py_ssize_t start, Py_ssize_t stop,
                       char *dst) {
    Py_ssize_t at = 0;
    for (Py_ssize_t i = 0; i < count && at < stop; i++) {
        Py_ssize_t end = at + views[i].len;
        if (end > start) {
            Py_ssize_t lo = start > at ? start - at : 0;
            Py_ssize_t hi = (stop < end ? stop : end) - at;
            memcpy(dst, (const char *)views[i].buf + lo, (size_t)(hi - lo));
            dst += hi - lo;
        }
        at = end;
    }
}

static PyObject *bigcopy_join_range(PyObject *self, PyObject *args) {
    PyObject *arg, *parts;
    Py_ssize_t start, stop;
    if (!PyArg_ParseTuple(args, "Onn:join_range", &arg, &start, &stop))
        return NULL;
    parts = PySequence_Fast(arg, "join_range: parts must be a sequence of buffers");
    if (parts == NULL)
        return NULL;
    Py_ssize_t count = PySequence_Fast_GET_SIZE(parts);
    Py_buffer *views = PyMem_Calloc(count ? (size_t)count : 1, sizeof(Py_buffer));
    if (views == NULL) {
        Py_DECREF(parts);
        return PyErr_NoMemory();
    }
    PyObject *out = NULL;
    Py_ssize_t taken = 0, total = 0, size = 0;
    for (; taken < count; taken++) {
        if (PyObject_GetBuffer(PySequence_Fast_GET_ITEM(parts, taken), &views[taken], PyBUF_SIMPLE) < 0)
            break;
        total += views[taken].len;
    }
    if (taken == count) {
        if (start < 0)
            start = 0;
        if (stop > total)
            stop = total;
        size = stop > start ? stop - start : 0;
        out = PyBytes_FromStringAndSize(NULL, size);
    }
    if (out != NULL && size >= NOGIL_FROM) {
        char *dst = PyBytes_AS_STRING(out);
        Py_BEGIN_ALLOW_THREADS
        copy_range(views, count, start, stop, dst);
        Py_END_ALLOW_THREADS
    } else if (out != NULL && size > 0) {
        copy_range(views, count, start, stop, PyBytes_AS_STRING(out));
    }
    for (Py_ssize_t i = 0; i < taken; i++)
        PyBuffer_Release(&views[i]);
    PyMem_Free(views);
    Py_DECREF(parts);
    return out;
}

/* A bytes object being filled is private to its ReadBuffer until take(): nobody else holds a
 * reference, so it may be written (by the kernel, through the exported buffer) and then cut
 * to its length in place (_PyBytes_Resize needs the only reference; a shrinking realloc does
 * not move or copy a heap block). A read shorter than copy_below is copied out instead: with
 * glibc's adaptive thresholds a shrink gives the heap top back and the next read's buffer
 * page-faults it in again (80 us a read measured, against 0.3 us with the broker's fixed
 * thresholds, server/allocator.py), so the transport sets copy_below by those. */
typedef struct {
    PyObject_HEAD
    PyObject *held;         /* the bytes the next read fills, or NULL */
    Py_ssize_t copy_below;  /* a read shorter than this is copied out, the buffer kept */
} ReadBufferObject;

static int ReadBuffer_init(ReadBufferObject *self, PyObject *args, PyObject *kwds) {
    static char *kwlist[] = {"copy_below", NULL};
    Py_ssize_t copy_below = 0;
    if (!PyArg_ParseTupleAndKeywords(args, kwds, "|n:ReadBuffer", kwlist, &copy_below))
        return -1;
    self->copy_below = copy_below;
    return 0;
}

static void ReadBuffer_dealloc(ReadBufferObject *self) {
    Py_CLEAR(self->held);
    Py_TYPE(self)->tp_free((PyObject *)self);
}

static PyObject *ReadBuffer_get(ReadBufferObject *self, PyObject *arg) {
    Py_ssize_t size;
    if (vmq_ssize(arg, &size) < 0)
        return NULL;
    if (size <= 0) {
        PyErr_SetString(PyExc_ValueError, "ReadBuffer.get: size must be positive");
        return NULL;
    }
    if (self->held == NULL || PyBytes_GET_SIZE(self->held) != size) {
        Py_CLEAR(self->held);
        self->held = PyBytes_FromStringAndSize(NULL, size);
        if (self->held == NULL)
            return NULL;
    }
    Py_INCREF(self);
    return (PyObject *)self;
}

static PyObject *ReadBuffer_take(ReadBufferObject *self, PyObject *arg) {
    Py_ssize_t n;
    if (vmq_ssize(arg, &n) < 0)
        return NULL;
    PyObject *out = self->held;
    if (out == NULL || n < 0 || n > PyBytes_GET_SIZE(out)) {
        PyErr_SetString(PyExc_ValueError, "ReadBuffer.take: nothing read, or more than given");
        return NULL;
    }
    if (n < self->copy_below) /* (cheaper than a shrink, and the buffer serves again) */
        return PyBytes_FromStringAndSize(PyBytes_AS_STRING(out), n);
    self->held = NULL;
    if (n != PyBytes_GET_SIZE(out) && _PyBytes_Resize(&out, n) < 0)
        return NULL; /* (out was freed) */
    return out;
}

static int ReadBuffer_getbuffer(ReadBufferObject *self, Py_buffer *view, int flags) {
    if (self->held == NULL) {
        PyErr_SetString(PyExc_BufferError, "ReadBuffer: get() first");
        return -1;
    }
    return PyBuffer_FillInfo(view, (PyObject *)self, PyBytes_AS_STRING(self->held),
                             PyBytes_GET_SIZE(self->held), 0, flags);
}

/* (asyncio's selector loop checks the buffer's len() before reading into it) */
static Py_ssize_t ReadBuffer_len(ReadBufferObject *self) {
    return self->held != NULL ? PyBytes_GET_SIZE(self->held) : 0;
}

static PySequenceMethods ReadBuffer_as_sequence = {.sq_length = (lenfunc)ReadBuffer_len};

static PyBufferProcs ReadBuffer_as_buffer = {(getbufferproc)ReadBuffer_getbuffer, NULL};

static PyMethodDef ReadBuffer_methods[] = {
    {"get", (PyCFunction)ReadBuffer_get, METH_O,
     "get(size) -> self: a writable buffer of size bytes (a fresh bytes object inside) for "
     "the next read."},
    {"take", (PyCFunction)ReadBuffer_take, METH_O,
     "take(n) -> bytes: the buffer's first n bytes as the bytes object itself (no copy; the "
     "next get() makes a new one), or, below copy_below, a copy of them."},
    {NULL, NULL, 0, NULL},
};

static PyTypeObject ReadBufferType = {
    PyVarObject_HEAD_INIT(NULL, 0).tp_name = "vibemq_server.protocol._bigcopy.ReadBuffer",
    .tp_basicsize = sizeof(ReadBufferObject),
    .tp_dealloc = (destructor)ReadBuffer_dealloc,
    .tp_as_buffer = &ReadBuffer_as_buffer,
    .tp_as_sequence = &ReadBuffer_as_sequence,
    .tp_flags = Py_TPFLAGS_DEFAULT,
    .tp_doc = "A socket read's buffer that becomes the read's bytes without a copy.",
    .tp_methods = ReadBuffer_methods,
    .tp_new = PyType_GenericNew,
    .tp_init = (initproc)ReadBuffer_init,
};

/* PayloadFill: a large payload's own bytes object, filled in place -- the part of it already
 * read copied in (write), the rest read by the kernel straight into it (the transport's
 * get_buffer hands the fill out while a frame's payload is incomplete, buffer_updated calls
 * advance): a payload cut over reads then needs no join (protocol/bigcopy.py). The bytes object
 * is private to the fill until take(): nobody else sees it while it is written. The buffer it
 * exports is the unfilled rest, [pos, size); len() is what is left. */
typedef struct {
    PyObject_HEAD
    PyObject *data;  /* the payload being filled; NULL once taken */
    Py_ssize_t pos;  /* bytes filled */
    Py_ssize_t exports;
} PayloadFillObject;

static int PayloadFill_init(PayloadFillObject *self, PyObject *args, PyObject *kwds) {
    static char *kwlist[] = {"size", NULL};
    Py_ssize_t size;
    if (!PyArg_ParseTupleAndKeywords(args, kwds, "n:PayloadFill", kwlist, &size))
        return -1;
    if (size < 0) {
        PyErr_SetString(PyExc_ValueError, "PayloadFill: size must not be negative");
        return -1;
    }
    if (self->data != NULL || self->exports) {
        PyErr_SetString(PyExc_RuntimeError, "PayloadFill: already initialised");
        return -1;
    }
    self->data = PyBytes_FromStringAndSize(NULL, size);
    self->pos = 0;
    return self->data == NULL ? -1 : 0;
}

static void PayloadFill_dealloc(PayloadFillObject *self) {
    Py_CLEAR(self->data);
    Py_TYPE(self)->tp_free((PyObject *)self);
}

static int fill_open(PayloadFillObject *self) {
    if (self->data == NULL) {
        PyErr_SetString(PyExc_ValueError, "PayloadFill: already taken");
        return 0;
    }
    return 1;
}

/* advance() and take() run while the read's export is still held (uvloop releases it after
 * buffer_updated): harmless, the reader is done writing by then; a write() would move the
 * exported rest under a reader, so it is refused during an export. */
static PyObject *PayloadFill_write(PayloadFillObject *self, PyObject *arg) {
    if (!fill_open(self))
        return NULL;
    if (self->exports) {
        PyErr_SetString(PyExc_BufferError, "PayloadFill: a read into it is under way");
        return NULL;
    }
    Py_buffer view;
    if (PyObject_GetBuffer(arg, &view, PyBUF_SIMPLE) < 0)
        return NULL;
    Py_ssize_t room = PyBytes_GET_SIZE(self->data) - self->pos;
    Py_ssize_t n = view.len < room ? view.len : room;
    memcpy(PyBytes_AS_STRING(self->data) + self->pos, view.buf, (size_t)n);
    self->pos += n;
    PyBuffer_Release(&view);
    return PyLong_FromSsize_t(n);
}

static PyObject *PayloadFill_advance(PayloadFillObject *self, PyObject *arg) {
    Py_ssize_t n;
    if (vmq_ssize(arg, &n) < 0)
        return NULL;
    if (!fill_open(self))
        return NULL;
    if (n < 0 || n > PyBytes_GET_SIZE(self->data) - self->pos) {
        PyErr_SetString(PyExc_ValueError, "PayloadFill.advance: more than was left");
        return NULL;
    }
    self->pos += n;
    return PyBool_FromLong(self->pos == PyBytes_GET_SIZE(self->data));
}

static PyObject *PayloadFill_take(PayloadFillObject *self, PyObject *Py_UNUSED(ignored)) {
    if (!fill_open(self))
        return NULL;
    if (self->pos != PyBytes_GET_SIZE(self->data)) {
        PyErr_SetString(PyExc_ValueError, "PayloadFill.take: not full yet");
        return NULL;
    }
    PyObject *out = self->data;
    self->data = NULL;
    return out;
}

static PyObject *PayloadFill_get_filled(PayloadFillObject *self, void *closure) {
    return PyLong_FromSsize_t(self->pos);
}

static PyObject *PayloadFill_get_full(PayloadFillObject *self, void *closure) {
    return PyBool_FromLong(self->data != NULL && self->pos == PyBytes_GET_SIZE(self->data));
}

static int PayloadFill_getbuffer(PayloadFillObject *self, Py_buffer *view, int flags) {
    if (self->data == NULL) {
        PyErr_SetString(PyExc_BufferError, "PayloadFill: already taken");
        return -1;
    }
    if (PyBuffer_FillInfo(view, (PyObject *)self, PyBytes_AS_STRING(self->data) + self->pos,
                          PyBytes_GET_SIZE(self->data) - self->pos, 0, flags) < 0)
        return -1;
    self->exports++;
    return 0;
}

static void PayloadFill_releasebuffer(PayloadFillObject *self, Py_buffer *view) {
    self->exports--;
}

static Py_ssize_t PayloadFill_len(PayloadFillObject *self) {
    return self->data != NULL ? PyBytes_GET_SIZE(self->data) - self->pos : 0;
}

static PySequenceMethods PayloadFill_as_sequence = {.sq_length = (lenfunc)PayloadFill_len};

static PyBufferProcs PayloadFill_as_buffer = {(getbufferproc)PayloadFill_getbuffer,
                                              (releasebufferproc)PayloadFill_releasebuffer};

static PyMethodDef PayloadFill_methods[] = {
    {"write", (PyCFunction)PayloadFill_write, METH_O,
     "write(data) -> int: copy as much of data as there is room for; how much that was."},
    {"advance", (PyCFunction)PayloadFill_advance, METH_O,
     "advance(n) -> bool: n more bytes were read into the exported rest; True once full."},
    {"take", (PyCFunction)PayloadFill_take, METH_NOARGS,
     "take() -> bytes: the full payload (the bytes object itself, no copy); once."},
    {NULL, NULL, 0, NULL},
};

static PyGetSetDef PayloadFill_getset[] = {
    {"filled", (getter)PayloadFill_get_filled, NULL, "bytes filled so far", NULL},
    {"full", (getter)PayloadFill_get_full, NULL, "every byte is in (and not yet taken)", NULL},
    {NULL, NULL, NULL, NULL, NULL},
};

static PyTypeObject PayloadFillType = {
    PyVarObject_HEAD_INIT(NULL, 0).tp_name = "vibemq_server.protocol._bigcopy.PayloadFill",
    .tp_basicsize = sizeof(PayloadFillObject),
    .tp_dealloc = (destructor)PayloadFill_dealloc,
    .tp_as_buffer = &PayloadFill_as_buffer,
    .tp_as_sequence = &PayloadFill_as_sequence,
    .tp_flags = Py_TPFLAGS_DEFAULT,
    .tp_doc = "A payload's bytes object, filled in place (the rest read straight into it).",
    .tp_methods = PayloadFill_methods,
    .tp_getset = PayloadFill_getset,
    .tp_new = PyType_GenericNew,
    .tp_init = (initproc)PayloadFill_init,
};

static PyMethodDef methods[] = {
    {"join_range", bigcopy_join_range, METH_VARARGS,
     "join_range(parts, start, stop) -> bytes: bytes start:stop of the buffers in the sequence "
     "parts, joined (the GIL released for a large copy)."},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {
    PyModuleDef_HEAD_INIT, "_bigcopy", "Large copies with the GIL released.", -1, methods,
};

PyMODINIT_FUNC PyInit__bigcopy(void) {
    static PyTypeObject *const types[] = {&ReadBufferType, &PayloadFillType, NULL};
    PyObject *m = vmq_module(&module, types);
    if (m != NULL && PyModule_AddIntConstant(m, "NOGIL_FROM", NOGIL_FROM) < 0)
        Py_CLEAR(m);
    return m;
}
