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

static PyMethodDef methods[] = {
    {"glue", (PyCFunction)(void (*)(void))glue, METH_FASTCALL,
     "glue(*parts) -> bytes: the parts joined, as b\"\".join(parts)."},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {
    PyModuleDef_HEAD_INIT, "_glue", "A frame's small pieces joined in one call.", -1, methods,
};

PyMODINIT_FUNC PyInit__glue(void) { return PyModule_Create(&module); }
