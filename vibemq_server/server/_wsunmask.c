/* A run of a WebSocket client's whole binary frames, unmasked into one bytes object, in one
 * call (vibemq_server/server/websocket.py; the pure equivalent is websocket.unmask_run_pure).
 *
 * An MQTT client over WebSockets sends each packet as one masked binary frame; a read holds
 * dozens of them. Per frame in Python (two slices, the library's apply_mask, a list append,
 * then a join) cost about as much as the MQTT parse of the packet; here a read's run of such
 * frames is one header scan and one pass of 8-byte XORs into the output.
 *
 * unmask_run(buf, pos, max_message) -> (payload, stop): from pos, the frames that are whole
 * (all in buf), FIN + binary with no extension bits (first byte 0x82), masked, and at most
 * max_message bytes long; payload is their unmasked data joined, stop where the first other
 * frame (or the end of buf) is. Everything else (control frames, fragments, unmasked or
 * oversized frames) is left for the caller, which hands it to the WebSocket library.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stdint.h>
#include <string.h>

/* Where the fast frame at p ends (header + payload), with its header size and payload length;
 * 0 when the frame at p is not one (or is not complete in [p, end)). */
static Py_ssize_t fast_frame(const unsigned char *p, const unsigned char *end,
                             Py_ssize_t max_message, Py_ssize_t *head, Py_ssize_t *length) {
    Py_ssize_t avail = end - p;
    if (avail < 2 || p[0] != 0x82 || !(p[1] & 0x80))
        return 0;
    uint64_t len = p[1] & 0x7F;
    Py_ssize_t h = 2;
    if (len == 126) {
        if (avail < 4)
            return 0;
        len = ((uint64_t)p[2] << 8) | p[3];
        h = 4;
    } else if (len == 127) {
        if (avail < 10)
            return 0;
        len = 0;
        for (int i = 0; i < 8; i++)
            len = (len << 8) | p[2 + i];
        h = 10;
    }
    if (len > (uint64_t)max_message)
        return 0; /* the library refuses it (1009) */
    h += 4;       /* the mask */
    if (avail < h || (uint64_t)(avail - h) < len)
        return 0;
    *head = h;
    *length = (Py_ssize_t)len;
    return h + (Py_ssize_t)len;
}

static void unmask(unsigned char *dst, const unsigned char *src, Py_ssize_t n,
                   const unsigned char *key) {
    uint32_t k32;
    memcpy(&k32, key, 4);
    uint64_t k64 = ((uint64_t)k32 << 32) | k32;
    Py_ssize_t i = 0;
    for (; i + 8 <= n; i += 8) {
        uint64_t v;
        memcpy(&v, src + i, 8);
        v ^= k64;
        memcpy(dst + i, &v, 8);
    }
    for (; i < n; i++)
        dst[i] = src[i] ^ key[i & 3];
}

static PyObject *wsunmask_unmask_run(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
    if (nargs != 3) {
        PyErr_SetString(PyExc_TypeError, "unmask_run(buf, pos, max_message): 3 arguments");
        return NULL;
    }
    PyObject *buf = args[0];
    if (!PyBytes_Check(buf)) {
        PyErr_SetString(PyExc_TypeError, "unmask_run: buf must be bytes");
        return NULL;
    }
    Py_ssize_t pos = PyLong_AsSsize_t(args[1]);
    if (pos == -1 && PyErr_Occurred())
        return NULL;
    Py_ssize_t max_message = PyLong_AsSsize_t(args[2]);
    if (max_message == -1 && PyErr_Occurred())
        return NULL;
    if (max_message < 0)
        max_message = 0;
    Py_ssize_t size = PyBytes_GET_SIZE(buf);
    if (pos < 0 || pos > size) {
        PyErr_SetString(PyExc_ValueError, "unmask_run: pos outside buf");
        return NULL;
    }
    const unsigned char *base = (const unsigned char *)PyBytes_AS_STRING(buf);
    const unsigned char *end = base + size;
    /* first pass: how far the run goes and how much data it holds */
    Py_ssize_t at = pos, total = 0, head, length, step;
    while ((step = fast_frame(base + at, end, max_message, &head, &length)) > 0) {
        total += length;
        at += step;
    }
    Py_ssize_t stop = at;
    PyObject *out = PyBytes_FromStringAndSize(NULL, total);
    if (out == NULL)
        return NULL;
    unsigned char *dst = (unsigned char *)PyBytes_AS_STRING(out);
    for (at = pos; at < stop; at += step) {
        step = fast_frame(base + at, end, max_message, &head, &length);
        unmask(dst, base + at + head, length, base + at + head - 4);
        dst += length;
    }
    PyObject *stop_obj = PyLong_FromSsize_t(stop);
    if (stop_obj == NULL) {
        Py_DECREF(out);
        return NULL;
    }
    PyObject *result = PyTuple_Pack(2, out, stop_obj);
    Py_DECREF(out);
    Py_DECREF(stop_obj);
    return result;
}

static PyMethodDef wsunmask_methods[] = {
    {"unmask_run", (PyCFunction)(void (*)(void))wsunmask_unmask_run, METH_FASTCALL,
     "unmask_run(buf, pos, max_message, /) -> (payload, stop): a run of whole masked binary\n"
     "frames from pos, their data unmasked and joined, and where the run stops."},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef wsunmask_module = {
    PyModuleDef_HEAD_INIT, "_wsunmask",
    "A run of WebSocket client frames unmasked in one call (server/websocket.py).", -1,
    wsunmask_methods,
};

PyMODINIT_FUNC PyInit__wsunmask(void) { return PyModule_Create(&wsunmask_module); }
