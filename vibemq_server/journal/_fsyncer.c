/* The journal's fsync threads without the GIL (journal/fsyncer.py has the Python twin).
 *
 * The loop calls request(fd, number) (under the GIL); a pthread takes it, calls fsync(2)
 * and times it without ever taking the GIL, appends (number, seconds, errno) to the
 * completed list and writes the eventfd; the loop, woken by the eventfd (add_reader), takes
 * the list with completed(). An executor thread needed the GIL twice per fsync (after its
 * queue wait and after fsync returned) and waited for a busy loop to hand it over, up to
 * the interpreter's switch interval each time.
 *
 * Locking: one mutex guards the requests, the completions and the stop flag. The threads
 * never touch Python objects; the loop holds the GIL and takes the mutex only briefly, so the
 * two locks are never waited for in the opposite order. The completed list's room is grown
 * by request() (under the GIL), so a thread never allocates.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>

#include <errno.h>
#include <pthread.h>
#include <stdint.h>
#include <string.h>
#include <sys/eventfd.h>
#include <time.h>
#include <unistd.h>

#include "../_cext/common.h"

typedef struct {
    long long number;
    int fd;
} Request;

typedef struct {
    long long number;
    double seconds;
    int err;
} Done;

typedef struct {
    PyObject_HEAD
    pthread_mutex_t mu;
    pthread_cond_t cond;
    Request *reqs; /* requests[head:len] wait for a thread */
    size_t rhead, rlen, rcap;
    Done *done; /* completed, not yet taken */
    size_t dlen, dcap;
    size_t outstanding; /* requested and not yet taken by completed() */
    int efd;
    int nthreads;
    pthread_t *threads;
    int stopping;
    int started; /* mutex and cond initialised */
} Fsyncs;

static double now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec / 1e9;
}

static void *run(void *arg) {
    Fsyncs *s = (Fsyncs *)arg;
    pthread_mutex_lock(&s->mu);
    for (;;) {
        while (s->rhead == s->rlen && !s->stopping)
            pthread_cond_wait(&s->cond, &s->mu);
        if (s->rhead == s->rlen)
            break; /* stopping, and every request served */
        Request r = s->reqs[s->rhead++];
        if (s->rhead == s->rlen)
            s->rhead = s->rlen = 0;
        pthread_mutex_unlock(&s->mu);
        double started = now_s();
        int err = fsync(r.fd) == 0 ? 0 : errno;
        double seconds = now_s() - started;
        pthread_mutex_lock(&s->mu);
        /* room was made by request(): dcap >= outstanding >= dlen + 1 */
        s->done[s->dlen].number = r.number;
        s->done[s->dlen].seconds = seconds;
        s->done[s->dlen].err = err;
        s->dlen++;
        pthread_mutex_unlock(&s->mu);
        uint64_t one = 1;
        ssize_t n;
        do {
            n = write(s->efd, &one, sizeof one);
        } while (n < 0 && errno == EINTR);
        /* (EAGAIN: the counter is at its maximum, so the loop is woken anyway) */
        pthread_mutex_lock(&s->mu);
    }
    pthread_mutex_unlock(&s->mu);
    return NULL;
}

static void stop_threads(Fsyncs *s) {
    if (s->threads == NULL)
        return;
    pthread_mutex_lock(&s->mu);
    s->stopping = 1;
    pthread_cond_broadcast(&s->cond);
    pthread_mutex_unlock(&s->mu);
    Py_BEGIN_ALLOW_THREADS
    for (int i = 0; i < s->nthreads; i++)
        pthread_join(s->threads[i], NULL);
    Py_END_ALLOW_THREADS
    PyMem_Free(s->threads);
    s->threads = NULL;
    s->nthreads = 0;
}

static int Fsyncs_init(Fsyncs *self, PyObject *args, PyObject *kwds) {
    int threads;
    if (kwds != NULL && PyDict_GET_SIZE(kwds)) {
        PyErr_SetString(PyExc_TypeError, "Fsyncs takes no keyword arguments");
        return -1;
    }
    if (!PyArg_ParseTuple(args, "i", &threads))
        return -1;
    if (self->started) {
        PyErr_SetString(PyExc_RuntimeError, "Fsyncs already started");
        return -1;
    }
    if (threads < 1 || threads > 64) {
        PyErr_SetString(PyExc_ValueError, "threads must be 1..64");
        return -1;
    }
    self->efd = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
    if (self->efd < 0) {
        PyErr_SetFromErrno(PyExc_OSError);
        return -1;
    }
    pthread_mutex_init(&self->mu, NULL);
    pthread_cond_init(&self->cond, NULL);
    self->started = 1;
    self->threads = PyMem_Calloc((size_t)threads, sizeof(pthread_t));
    if (self->threads == NULL) {
        PyErr_NoMemory();
        return -1;
    }
    for (int i = 0; i < threads; i++) {
        int rc = pthread_create(&self->threads[i], NULL, run, self);
        if (rc != 0) {
            self->nthreads = i;
            stop_threads(self);
            errno = rc;
            PyErr_SetFromErrno(PyExc_OSError);
            return -1;
        }
        pthread_setname_np(self->threads[i], "vibemq-fsync");
        self->nthreads = i + 1;
    }
    return 0;
}

static void Fsyncs_dealloc(Fsyncs *self) {
    stop_threads(self);
    if (self->efd >= 0)
        close(self->efd);
    if (self->started) {
        pthread_mutex_destroy(&self->mu);
        pthread_cond_destroy(&self->cond);
    }
    PyMem_Free(self->reqs);
    PyMem_Free(self->done);
    Py_TYPE(self)->tp_free((PyObject *)self);
}

static PyObject *Fsyncs_new(PyTypeObject *type, PyObject *args, PyObject *kwds) {
    Fsyncs *self = (Fsyncs *)type->tp_alloc(type, 0);
    if (self != NULL)
        self->efd = -1;
    return (PyObject *)self;
}

static PyObject *Fsyncs_fileno(Fsyncs *self, PyObject *unused) {
    if (self->efd < 0) {
        PyErr_SetString(PyExc_ValueError, "closed");
        return NULL;
    }
    return PyLong_FromLong(self->efd);
}

static PyObject *Fsyncs_request(Fsyncs *self, PyObject *const *args, Py_ssize_t nargs) {
    if (vmq_nargs(nargs, 2, "request") < 0)
        return NULL;
    long fd = PyLong_AsLong(args[0]);
    if (fd == -1 && PyErr_Occurred())
        return NULL;
    if (fd < 0 || fd > INT32_MAX) {
        PyErr_SetString(PyExc_ValueError, "not a file descriptor");
        return NULL;
    }
    long long number = PyLong_AsLongLong(args[1]);
    if (number == -1 && PyErr_Occurred())
        return NULL;
    if (self->threads == NULL) {
        PyErr_SetString(PyExc_ValueError, "closed");
        return NULL;
    }
    pthread_mutex_lock(&self->mu);
    int rc = vmq_grow((void **)&self->reqs, &self->rcap, self->rlen + 1, sizeof(Request), 8);
    if (rc == 0)
        rc = vmq_grow((void **)&self->done, &self->dcap, self->outstanding + 1, sizeof(Done), 8);
    if (rc == 0) {
        self->reqs[self->rlen].fd = (int)fd;
        self->reqs[self->rlen].number = number;
        self->rlen++;
        self->outstanding++;
        pthread_cond_signal(&self->cond);
    }
    pthread_mutex_unlock(&self->mu);
    if (rc != 0)
        return NULL;
    Py_RETURN_NONE;
}

static PyObject *Fsyncs_completed(Fsyncs *self, PyObject *unused) {
    if (self->efd >= 0) {
        uint64_t count;
        ssize_t n;
        do {
            n = read(self->efd, &count, sizeof count);
        } while (n < 0 && errno == EINTR);
        /* (EAGAIN: nothing signalled since the last read) */
    }
    if (!self->started)
        return PyList_New(0);
    pthread_mutex_lock(&self->mu);
    size_t n = self->dlen;
    Done *copy = NULL;
    if (n) {
        copy = PyMem_Malloc(n * sizeof(Done));
        if (copy == NULL) {
            pthread_mutex_unlock(&self->mu);
            return PyErr_NoMemory();
        }
        memcpy(copy, self->done, n * sizeof(Done));
        self->dlen = 0;
        self->outstanding -= n;
    }
    pthread_mutex_unlock(&self->mu);
    PyObject *out = PyList_New((Py_ssize_t)n);
    if (out == NULL)
        goto fail;
    for (size_t i = 0; i < n; i++) {
        PyObject *err;
        if (copy[i].err == 0) {
            err = Py_NewRef(Py_None);
        } else {
            err = PyObject_CallFunction(
                PyExc_OSError, "is", copy[i].err, strerror(copy[i].err));
            if (err == NULL)
                goto fail;
        }
        PyObject *item = Py_BuildValue("(LdN)", copy[i].number, copy[i].seconds, err);
        if (item == NULL)
            goto fail;
        PyList_SET_ITEM(out, (Py_ssize_t)i, item);
    }
    PyMem_Free(copy);
    return out;
fail:
    Py_XDECREF(out);
    PyMem_Free(copy);
    return NULL;
}

static PyObject *Fsyncs_close(Fsyncs *self, PyObject *unused) {
    stop_threads(self);
    if (self->efd >= 0) {
        close(self->efd);
        self->efd = -1;
    }
    Py_RETURN_NONE;
}

static PyMethodDef Fsyncs_methods[] = {
    {"fileno", (PyCFunction)Fsyncs_fileno, METH_NOARGS,
     "The eventfd that becomes readable when fsyncs have completed."},
    {"request", (PyCFunction)(void (*)(void))Fsyncs_request, METH_FASTCALL,
     "request(fd, number): fsync fd in a thread."},
    {"completed", (PyCFunction)Fsyncs_completed, METH_NOARGS,
     "The (number, seconds, error or None) completed since the last call."},
    {"close", (PyCFunction)Fsyncs_close, METH_NOARGS,
     "Finish the requested fsyncs, stop the threads, close the eventfd."},
    {NULL, NULL, 0, NULL},
};

static PyTypeObject FsyncsType = {
    PyVarObject_HEAD_INIT(NULL, 0).tp_name = "vibemq_server.journal._fsyncer.Fsyncs",
    .tp_basicsize = sizeof(Fsyncs),
    .tp_flags = Py_TPFLAGS_DEFAULT,
    .tp_doc = "fsync threads without the GIL, completions read back after an eventfd wakes.",
    .tp_new = Fsyncs_new,
    .tp_init = (initproc)Fsyncs_init,
    .tp_dealloc = (destructor)Fsyncs_dealloc,
    .tp_methods = Fsyncs_methods,
};

static struct PyModuleDef module = {
    PyModuleDef_HEAD_INIT, "_fsyncer", "The journal's fsync threads (C).", -1, NULL,
};

PyMODINIT_FUNC PyInit__fsyncer(void) {
    static PyTypeObject *const types[] = {&FsyncsType, NULL};
    return vmq_module(&module, types);
}
