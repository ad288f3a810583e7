/* What the package's C extensions (journal/_fsyncer.c, journal/_recbuf.c, protocol/_bigcopy.c)
 * would otherwise each write out: the module's creation with its types, a METH_FASTCALL
 * function's argument count, a size argument, a doubling PyMem buffer.
 *
 * A header of static inline functions (no shared library to link, nothing to load): each
 * extension includes it by its path relative to its own source ("../_cext/common.h"), so no
 * include_dirs is needed; it is listed as `depends` of those extensions in pyproject.toml and
 * scripts/build_ext.sh, which rebuilds them when it changes and puts it in the sdist.
 * Include it after <Python.h> (and PY_SSIZE_T_CLEAN).
 */
#ifndef VIBEMQ_CEXT_COMMON_H
#define VIBEMQ_CEXT_COMMON_H

#include <Python.h>
#include <stddef.h>
#include <stdint.h>

/* The module of `def` with each type of the NULL-terminated `types` readied and added under
 * its own name (the part of tp_name after the last dot); NULL with an exception set. */
static inline PyObject *vmq_module(PyModuleDef *def, PyTypeObject *const *types) {
    PyObject *m = PyModule_Create(def);
    if (m == NULL)
        return NULL;
    for (; *types != NULL; types++) {
        if (PyModule_AddType(m, *types) < 0) {
            Py_DECREF(m);
            return NULL;
        }
    }
    return m;
}

/* A METH_FASTCALL function called with `want` arguments: 0; otherwise -1 and TypeError
 * ("name takes N arguments"). */
static inline int vmq_nargs(Py_ssize_t nargs, Py_ssize_t want, const char *name) {
    if (nargs == want)
        return 0;
    PyErr_Format(PyExc_TypeError, "%s takes %zd arguments", name, want);
    return -1;
}

/* An int argument as a Py_ssize_t (in *out): 0, or -1 with the exception set. */
static inline int vmq_ssize(PyObject *arg, Py_ssize_t *out) {
    Py_ssize_t v = PyLong_AsSsize_t(arg);
    if (v == -1 && PyErr_Occurred())
        return -1;
    *out = v;
    return 0;
}

/* Room for `need` items of `item` bytes in the PyMem block *buf of *cap items: the capacity
 * doubled (from `first` when there is none yet) until it holds them. 0, or -1 with
 * MemoryError and the block as it was. Needs the GIL (PyMem_Realloc). */
static inline int vmq_grow(void **buf, size_t *cap, size_t need, size_t item, size_t first) {
    if (need <= *cap)
        return 0;
    size_t cap2 = *cap ? *cap : first;
    while (cap2 < need)
        cap2 = cap2 > SIZE_MAX / 2 ? need : cap2 * 2;
    if (cap2 > (size_t)PY_SSIZE_T_MAX / item) {
        PyErr_NoMemory();
        return -1;
    }
    void *grown = PyMem_Realloc(*buf, cap2 * item);
    if (grown == NULL) {
        PyErr_NoMemory();
        return -1;
    }
    *buf = grown;
    *cap = cap2;
    return 0;
}

#endif /* VIBEMQ_CEXT_COMMON_H */
