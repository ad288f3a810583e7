/* Join a byte range of a list of buffers into one bytes object, with the GIL released for the
 * copy: a decoder's one copy of a 64 MiB payload (about 50 ms here, page faults included) can
 * then run in a worker thread while the event loop serves the other connections
 * (vibemq_server/protocol/bigcopy.py; the pure equivalent is held.join_range).
 *
 * The buffers are exported (PyObject_GetBuffer) before the GIL is released and released after
 * it is taken back, so their memory stays put whatever other threads do meanwhile.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <string.h>

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
    PyObject *m = PyModule_Create(&module);
    if (m == NULL)
        return NULL;
    if (PyModule_AddIntConstant(m, "NOGIL_FROM", NOGIL_FROM) < 0) {
        Py_DECREF(m);
        return NULL;
    }
    return m;
}
