/* Columnar scanner of journal segments for the Spark data source (see docs/spark.md).
 *
 * scan() walks the records of a buffer (a window of a segment file), checks every record the
 * way vibemq_server/journal/records.py's decode_record does (length, CRC-32, body layout,
 * strict UTF-8 of the str16 fields, known record type and settle reason, exact body length)
 * and writes the rows that pass the queue and time filters straight into Arrow column
 * buffers (validity bitmaps, int32 offsets, values), returned as bytes objects that
 * columnar.py wraps with pyarrow. No Python object is made per record.
 *
 * walk() counts whole records from a position without decoding them (stream planning).
 *
 * The reference for every rule here is the pure-Python decoder; tests compare both on the
 * same journals, tails and damage included.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <zlib.h>

#define MAX_RECORD (384u * 1024u * 1024u) /* as journal/records.py */
#define NCOLS 20

enum { ST_FULL = 0, ST_END = 1, ST_INCOMPLETE = 2, ST_BAD = 3 };
enum { K_CREATE = 1, K_DELETE = 2, K_PUBLISH = 3, K_DELIVER = 4, K_SETTLE = 5 };
enum { R_DEAD_LETTERED = 3, N_REASONS = 6 };

/* -- growable buffers ------------------------------------------------------------------------ */

typedef struct {
    char *p;
    size_t len, cap;
} Buf;

static int buf_reserve(Buf *b, size_t extra) {
    if (b->len + extra <= b->cap) return 0;
    size_t cap = b->cap ? b->cap : 4096;
    while (cap < b->len + extra) cap *= 2;
    char *p = realloc(b->p, cap);
    if (!p) return -1;
    b->p = p;
    b->cap = cap;
    return 0;
}

static int buf_put(Buf *b, const void *src, size_t n) {
    if (buf_reserve(b, n)) return -1;
    memcpy(b->p + b->len, src, n);
    b->len += n;
    return 0;
}

/* A column: validity bitmap + fixed values, or validity + int32 offsets + data. */
typedef struct {
    Buf valid, values, data;
    int64_t nulls;
    int varlen;
} Col;

static int col_valid(Col *c, int64_t row, int ok) {
    if ((row & 7) == 0) {
        uint8_t z = 0;
        if (buf_put(&c->valid, &z, 1)) return -1;
    }
    if (ok)
        c->valid.p[row >> 3] |= (char)(1u << (row & 7));
    else
        c->nulls++;
    return 0;
}

static int col_i64(Col *c, int64_t row, int ok, int64_t v) {
    if (col_valid(c, row, ok)) return -1;
    if (!ok) v = 0;
    return buf_put(&c->values, &v, 8);
}

static int col_i32(Col *c, int64_t row, int ok, int32_t v) {
    if (col_valid(c, row, ok)) return -1;
    if (!ok) v = 0;
    return buf_put(&c->values, &v, 4);
}

/* Appends bytes to a var-length column's data and the offset after them. */
static int col_bytes(Col *c, int64_t row, int ok, const void *src, size_t n) {
    if (col_valid(c, row, ok)) return -1;
    if (ok && n && buf_put(&c->data, src, n)) return -1;
    int32_t end = (int32_t)c->data.len;
    return buf_put(&c->values, &end, 4);
}

/* -- reading helpers ---------------------------------------------------------------------- */

static inline uint16_t be16(const uint8_t *p) { return (uint16_t)((p[0] << 8) | p[1]); }
static inline uint32_t be32(const uint8_t *p) {
    return ((uint32_t)p[0] << 24) | ((uint32_t)p[1] << 16) | ((uint32_t)p[2] << 8) | p[3];
}
static inline uint64_t be64(const uint8_t *p) {
    return ((uint64_t)be32(p) << 32) | be32(p + 4);
}

/* Strict UTF-8 as Python's bytes.decode() accepts it: no overlongs, no surrogates, at most
 * U+10FFFF, no truncated sequence. */
static int utf8_ok(const uint8_t *s, size_t n) {
    size_t i = 0;
    while (i < n) {
        uint8_t c = s[i];
        if (c < 0x80) {
            i++;
            continue;
        }
        if (c >= 0xC2 && c <= 0xDF) {
            if (i + 1 >= n || (s[i + 1] & 0xC0) != 0x80) return 0;
            i += 2;
        } else if (c >= 0xE0 && c <= 0xEF) {
            if (i + 2 >= n) return 0;
            uint8_t c1 = s[i + 1];
            if ((c1 & 0xC0) != 0x80 || (s[i + 2] & 0xC0) != 0x80) return 0;
            if (c == 0xE0 && c1 < 0xA0) return 0;  /* overlong */
            if (c == 0xED && c1 > 0x9F) return 0;  /* surrogate */
            i += 3;
        } else if (c >= 0xF0 && c <= 0xF4) {
            if (i + 3 >= n) return 0;
            uint8_t c1 = s[i + 1];
            if ((c1 & 0xC0) != 0x80 || (s[i + 2] & 0xC0) != 0x80 || (s[i + 3] & 0xC0) != 0x80)
                return 0;
            if (c == 0xF0 && c1 < 0x90) return 0;  /* overlong */
            if (c == 0xF4 && c1 > 0x8F) return 0;  /* above U+10FFFF */
            i += 4;
        } else {
            return 0;
        }
    }
    return 1;
}

/* A cursor over one record body (after type and timestamp), like records.py's _Cursor. */
typedef struct {
    const uint8_t *p;
    size_t pos, len;
    const char *err;
} Cur;

static int cur_fixed(Cur *c, size_t n, const uint8_t **out) {
    if (c->pos > c->len || c->len - c->pos < n) {
        c->err = "malformed record body (truncated field)";
        return -1;
    }
    *out = c->p + c->pos;
    c->pos += n;
    return 0;
}

/* A str16 (strict UTF-8) or bytes32 (any bytes) field. */
static int cur_var(Cur *c, int wide, int text, const uint8_t **s, size_t *n) {
    const uint8_t *h;
    if (cur_fixed(c, wide ? 4 : 2, &h)) return -1;
    size_t len = wide ? be32(h) : be16(h);
    if (cur_fixed(c, len, s)) return -1;
    if (text && !utf8_ok(*s, len)) {
        c->err = "malformed record body (invalid UTF-8)";
        return -1;
    }
    *n = len;
    return 0;
}

/* -- one record -------------------------------------------------------------------------- */

typedef struct {
    const uint8_t *s;
    size_t n;
} Str;

typedef struct {
    Col c[NCOLS];
    Col mkeys, mvals; /* children of the headers map */
    int64_t rows, bytes;
    int payload_utf8, options_utf8; /* all payloads / options of the batch are valid UTF-8 */
    Str kinds[6], reasons[N_REASONS];
    Str filter[64];
    Py_ssize_t nfilter;
    Str *hk, *hv; /* scratch for one record's headers */
    size_t hcap;
} Batch;

enum {
    C_SEGMENT, C_OFFSET, C_TYPE, C_TS, C_QUEUE, C_SEQ, C_MSGID, C_PUBAT, C_EXPAT, C_PRIO,
    C_HEADERS, C_PAYLOAD, C_PAYBIN, C_PAYSIZE, C_ATTEMPTS, C_REASON, C_SETTLEDAT, C_DLR,
    C_DETAIL, C_OPTIONS
};

typedef struct {
    int kind;
    uint64_t ts, seq, pub, exp;
    uint32_t prio, attempts, reason;
    Str queue, msgid, payload, detail, options;
    size_t nh;
} Rec;

static int headers_scratch(Batch *b, size_t n) {
    if (n <= b->hcap) return 0;
    Str *k = realloc(b->hk, n * sizeof(Str)), *v;
    if (!k) return -1;
    b->hk = k;
    v = realloc(b->hv, n * sizeof(Str));
    if (!v) return -1;
    b->hv = v;
    b->hcap = n;
    return 0;
}

/* Parses a body into r; returns 0, -1 for a malformed body (r->... err set in c), -2 no memory.
 * Headers: a repeated key keeps its first position and its last value, as a dict does. */
static int parse(Batch *b, Rec *r, Cur *c) {
    const uint8_t *h;
    r->nh = 0;
    switch (r->kind) {
    case K_PUBLISH:
        if (cur_fixed(c, 27, &h)) return -1;
        r->seq = be64(h);
        r->pub = be64(h + 8);
        r->exp = be64(h + 16);
        r->prio = h[24];
        r->attempts = be16(h + 25);
        if (cur_var(c, 0, 1, &r->queue.s, &r->queue.n)) return -1;
        if (cur_var(c, 0, 1, &r->msgid.s, &r->msgid.n)) return -1;
        if (cur_fixed(c, 2, &h)) return -1;
        {
            size_t count = be16(h);
            if (headers_scratch(b, count)) return -2;
            for (size_t i = 0; i < count; i++) {
                Str k, v;
                if (cur_var(c, 0, 1, &k.s, &k.n)) return -1;
                if (cur_var(c, 0, 1, &v.s, &v.n)) return -1;
                size_t j = 0;
                for (; j < r->nh; j++)
                    if (b->hk[j].n == k.n && memcmp(b->hk[j].s, k.s, k.n) == 0) break;
                b->hk[j] = k;
                b->hv[j] = v;
                if (j == r->nh) r->nh++;
            }
        }
        if (cur_var(c, 1, 0, &r->payload.s, &r->payload.n)) return -1;
        break;
    case K_DELIVER:
        if (cur_fixed(c, 10, &h)) return -1;
        r->seq = be64(h);
        r->attempts = be16(h + 8);
        if (cur_var(c, 0, 1, &r->queue.s, &r->queue.n)) return -1;
        break;
    case K_SETTLE:
        if (cur_fixed(c, 9, &h)) return -1;
        r->seq = be64(h);
        r->reason = h[8];
        if (cur_var(c, 0, 1, &r->queue.s, &r->queue.n)) return -1;
        if (r->reason >= N_REASONS) {
            c->err = "malformed record body (unknown settle reason)";
            return -1;
        }
        if (cur_var(c, 0, 1, &r->detail.s, &r->detail.n)) return -1;
        break;
    case K_CREATE:
        if (cur_var(c, 0, 1, &r->queue.s, &r->queue.n)) return -1;
        if (cur_fixed(c, 8, &h)) return -1;
        if (cur_var(c, 1, 0, &r->options.s, &r->options.n)) return -1;
        break;
    case K_DELETE:
        if (cur_var(c, 0, 1, &r->queue.s, &r->queue.n)) return -1;
        break;
    default:
        c->err = "malformed record body (unknown record type)";
        return -1;
    }
    if (c->pos != c->len) {
        c->err = "record body length mismatch";
        return -1;
    }
    return 0;
}

static int keeps(const Batch *b, const Rec *r, int has_lo, int64_t lo, int has_hi, int64_t hi) {
    if (has_lo && (int64_t)r->ts < lo) return 0;
    if (has_hi && (int64_t)r->ts >= hi) return 0;
    if (b->nfilter == 0) return 1;
    for (Py_ssize_t i = 0; i < b->nfilter; i++)
        if (b->filter[i].n == r->queue.n && memcmp(b->filter[i].s, r->queue.s, r->queue.n) == 0)
            return 1;
    return 0;
}

#define TRY(x) \
    if (x) return -1

static int emit(Batch *b, const Rec *r, int64_t segment, int64_t offset) {
    Col *c = b->c;
    int64_t row = b->rows;
    int pub = r->kind == K_PUBLISH, settle = r->kind == K_SETTLE, create = r->kind == K_CREATE;
    int has_seq = pub || settle || r->kind == K_DELIVER;
    int64_t ts = (int64_t)r->ts * 1000;
    TRY(col_i64(&c[C_SEGMENT], row, 1, segment));
    TRY(col_i64(&c[C_OFFSET], row, 1, offset));
    TRY(col_bytes(&c[C_TYPE], row, 1, b->kinds[r->kind].s, b->kinds[r->kind].n));
    TRY(col_i64(&c[C_TS], row, 1, ts));
    TRY(col_bytes(&c[C_QUEUE], row, 1, r->queue.s, r->queue.n));
    TRY(col_i64(&c[C_SEQ], row, has_seq, (int64_t)r->seq));
    TRY(col_bytes(&c[C_MSGID], row, pub, r->msgid.s, r->msgid.n));
    TRY(col_i64(&c[C_PUBAT], row, pub, (int64_t)r->pub * 1000));
    TRY(col_i64(&c[C_EXPAT], row, pub && r->exp, (int64_t)r->exp * 1000));
    TRY(col_i32(&c[C_PRIO], row, pub, (int32_t)r->prio));
    /* headers: a map column; its offsets count entries */
    TRY(col_valid(&c[C_HEADERS], row, pub));
    const Str *dlr = NULL;
    if (pub) {
        for (size_t i = 0; i < r->nh; i++) {
            int64_t e = (int64_t)(b->mkeys.values.len / 4) - 1;
            TRY(col_bytes(&b->mkeys, e, 1, b->hk[i].s, b->hk[i].n));
            TRY(col_bytes(&b->mvals, e, 1, b->hv[i].s, b->hv[i].n));
            if (b->hk[i].n == 16 && memcmp(b->hk[i].s, "deadLetterReason", 16) == 0)
                dlr = &b->hv[i];
        }
        if (!utf8_ok(r->payload.s, r->payload.n)) b->payload_utf8 = 0;
    }
    int32_t entries = (int32_t)(b->mkeys.values.len / 4) - 1;
    TRY(buf_put(&c[C_HEADERS].values, &entries, 4));
    TRY(col_bytes(&c[C_PAYLOAD], row, pub, r->payload.s, r->payload.n));
    TRY(col_i32(&c[C_PAYSIZE], row, pub, (int32_t)r->payload.n));
    TRY(col_i32(&c[C_ATTEMPTS], row, pub || r->kind == K_DELIVER, (int32_t)r->attempts));
    const Str *reason = settle ? &b->reasons[r->reason] : NULL;
    TRY(col_bytes(&c[C_REASON], row, settle, reason ? reason->s : NULL, reason ? reason->n : 0));
    TRY(col_i64(&c[C_SETTLEDAT], row, settle, ts));
    if (settle && r->reason == R_DEAD_LETTERED) dlr = &r->detail;
    TRY(col_bytes(&c[C_DLR], row, dlr != NULL, dlr ? dlr->s : NULL, dlr ? dlr->n : 0));
    TRY(col_bytes(&c[C_DETAIL], row, settle, r->detail.s, r->detail.n));
    if (create && !utf8_ok(r->options.s, r->options.n)) b->options_utf8 = 0;
    TRY(col_bytes(&c[C_OPTIONS], row, create, r->options.s, r->options.n));
    b->rows++;
    b->bytes += (int64_t)(r->payload.n * 2 + r->queue.n + r->msgid.n + r->options.n + 64);
    return 0;
}

/* -- Python glue ------------------------------------------------------------------------- */

static void batch_free(Batch *b) {
    for (int i = 0; i < NCOLS; i++) {
        free(b->c[i].valid.p);
        free(b->c[i].values.p);
        free(b->c[i].data.p);
    }
    free(b->mkeys.valid.p);
    free(b->mkeys.values.p);
    free(b->mkeys.data.p);
    free(b->mvals.valid.p);
    free(b->mvals.values.p);
    free(b->mvals.data.p);
    free(b->hk);
    free(b->hv);
}

static PyObject *as_bytes(const Buf *b) {
    return PyBytes_FromStringAndSize(b->p ? b->p : "", (Py_ssize_t)b->len);
}

/* (validity or None, values, data or None) for a column */
static PyObject *col_tuple(const Col *c) {
    PyObject *v = c->nulls ? as_bytes(&c->valid) : (Py_INCREF(Py_None), Py_None);
    PyObject *d = c->varlen ? as_bytes(&c->data) : (Py_INCREF(Py_None), Py_None);
    PyObject *vals = as_bytes(&c->values);
    if (!v || !d || !vals) {
        Py_XDECREF(v);
        Py_XDECREF(d);
        Py_XDECREF(vals);
        return NULL;
    }
    return Py_BuildValue("(NNNL)", v, vals, d, (long long)c->nulls);
}

static int strs_from(PyObject *seq, Str *out, Py_ssize_t max, Py_ssize_t *n) {
    PyObject *fast = PySequence_Fast(seq, "expected a sequence of bytes");
    if (!fast) return -1;
    Py_ssize_t len = PySequence_Fast_GET_SIZE(fast);
    if (len > max) {
        Py_DECREF(fast);
        PyErr_SetString(PyExc_ValueError, "too many values");
        return -1;
    }
    for (Py_ssize_t i = 0; i < len; i++) {
        PyObject *item = PySequence_Fast_GET_ITEM(fast, i);
        if (!PyBytes_Check(item)) {
            Py_DECREF(fast);
            PyErr_SetString(PyExc_TypeError, "expected bytes");
            return -1;
        }
        /* the caller keeps the sequence (and so the bytes) alive for the call */
        out[i].s = (const uint8_t *)PyBytes_AS_STRING(item);
        out[i].n = (size_t)PyBytes_GET_SIZE(item);
    }
    Py_DECREF(fast);
    *n = len;
    return 0;
}

static const char scan_doc[] =
    "scan(buf, pos, base, segment, kinds, reasons, queues, lo, hi, max_rows, max_bytes)\n"
    "-> (status, pos, error, rows, payload_utf8, options_utf8, columns, keys, values)";

static PyObject *scan(PyObject *self, PyObject *args) {
    (void)self;
    Py_buffer view;
    Py_ssize_t pos;
    long long base, segment, lo, hi, max_rows, max_bytes;
    PyObject *kinds, *reasons, *queues, *lo_obj, *hi_obj;
    if (!PyArg_ParseTuple(args, "y*nLLOOOOOLL", &view, &pos, &base, &segment, &kinds, &reasons,
                          &queues, &lo_obj, &hi_obj, &max_rows, &max_bytes))
        return NULL;
    Batch b;
    memset(&b, 0, sizeof b);
    b.payload_utf8 = b.options_utf8 = 1;
    PyObject *result = NULL;
    Py_ssize_t nk, nr;
    int has_lo = lo_obj != Py_None, has_hi = hi_obj != Py_None;
    lo = has_lo ? PyLong_AsLongLong(lo_obj) : 0;
    hi = has_hi ? PyLong_AsLongLong(hi_obj) : 0;
    if (PyErr_Occurred()) goto done;
    if (strs_from(kinds, b.kinds, 6, &nk) || strs_from(reasons, b.reasons, N_REASONS, &nr) ||
        strs_from(queues, b.filter, 64, &b.nfilter))
        goto done;
    if (nk != 6 || nr != N_REASONS) {
        PyErr_SetString(PyExc_ValueError, "kinds must have 6 names, reasons 6");
        goto done;
    }
    for (int i = 0; i < NCOLS; i++) b.c[i].varlen = 0;
    int var[] = {C_TYPE, C_QUEUE, C_MSGID, C_PAYLOAD, C_REASON, C_DLR, C_DETAIL, C_OPTIONS};
    for (size_t i = 0; i < sizeof var / sizeof var[0]; i++) b.c[var[i]].varlen = 1;
    b.c[C_PAYBIN].varlen = 1; /* shares the payload column's buffers (filled by Python) */
    b.mkeys.varlen = b.mvals.varlen = 1;
    int32_t zero = 0;
    int nomem = 0;
    for (int i = 0; i < NCOLS; i++)
        if (b.c[i].varlen || i == C_HEADERS) nomem |= buf_put(&b.c[i].values, &zero, 4);
    nomem |= buf_put(&b.mkeys.values, &zero, 4) | buf_put(&b.mvals.values, &zero, 4);
    if (nomem) {
        PyErr_NoMemory();
        goto done;
    }

    const uint8_t *p = view.buf;
    size_t size = (size_t)view.len, at = (size_t)pos;
    int status = ST_END;
    const char *err = NULL;
    int oom = 0;
    Py_BEGIN_ALLOW_THREADS
    while (at < size) {
        if (b.rows >= max_rows || b.bytes >= max_bytes) {
            status = ST_FULL;
            break;
        }
        if (size - at < 8) {
            status = ST_INCOMPLETE;
            err = "incomplete record prefix";
            break;
        }
        uint32_t length = be32(p + at), crc = be32(p + at + 4);
        if (length < 9 || length > MAX_RECORD) {
            status = ST_BAD;
            err = "invalid record length";
            break;
        }
        if (size - at - 8 < length) {
            status = ST_INCOMPLETE;
            err = "incomplete record";
            break;
        }
        const uint8_t *inner = p + at + 8;
        if ((uint32_t)crc32(0L, inner, length) != crc) {
            status = ST_BAD;
            err = "checksum mismatch";
            break;
        }
        Rec r;
        memset(&r, 0, sizeof r);
        r.kind = inner[0];
        r.ts = be64(inner + 1);
        Cur c = {inner, 9, length, NULL};
        int rc = parse(&b, &r, &c);
        if (rc == -2) {
            oom = 1;
            break;
        }
        if (rc) {
            status = ST_BAD;
            err = c.err;
            break;
        }
        if (keeps(&b, &r, has_lo, lo, has_hi, hi) && emit(&b, &r, segment, base + (long long)at)) {
            oom = 1;
            break;
        }
        at += 8 + (size_t)length;
    }
    Py_END_ALLOW_THREADS
    if (oom) {
        PyErr_NoMemory();
        goto done;
    }
    PyObject *cols = PyTuple_New(NCOLS);
    if (!cols) goto done;
    for (int i = 0; i < NCOLS; i++) {
        PyObject *t = col_tuple(&b.c[i]);
        if (!t) {
            Py_DECREF(cols);
            goto done;
        }
        PyTuple_SET_ITEM(cols, i, t);
    }
    PyObject *keys = col_tuple(&b.mkeys), *vals = col_tuple(&b.mvals);
    if (!keys || !vals) {
        Py_DECREF(cols);
        Py_XDECREF(keys);
        Py_XDECREF(vals);
        goto done;
    }
    result = Py_BuildValue("(inzLiiNNN)", status, (Py_ssize_t)at, err, (long long)b.rows,
                           b.payload_utf8, b.options_utf8, cols, keys, vals);
done:
    batch_free(&b);
    PyBuffer_Release(&view);
    return result;
}

static const char walk_doc[] =
    "walk(buf, pos, max_records) -> (pos, count): whole records from pos (no CRC check), at\n"
    "most max_records (-1: no limit); stops at the first record that is incomplete or has an\n"
    "invalid length.";

static PyObject *walk(PyObject *self, PyObject *args) {
    (void)self;
    Py_buffer view;
    Py_ssize_t pos;
    long long limit;
    if (!PyArg_ParseTuple(args, "y*nL", &view, &pos, &limit)) return NULL;
    const uint8_t *p = view.buf;
    size_t size = (size_t)view.len, at = (size_t)pos;
    long long count = 0;
    while (count != limit && at < size && size - at >= 8) {
        uint32_t length = be32(p + at);
        if (length < 9 || length > MAX_RECORD || size - at - 8 < length) break;
        at += 8 + (size_t)length;
        count++;
    }
    PyBuffer_Release(&view);
    return Py_BuildValue("(nL)", (Py_ssize_t)at, count);
}

static PyMethodDef methods[] = {
    {"scan", scan, METH_VARARGS, scan_doc},
    {"walk", walk, METH_VARARGS, walk_doc},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {
    PyModuleDef_HEAD_INIT, "_colscan", "Columnar scanner of journal segments.", -1, methods,
    NULL, NULL, NULL, NULL,
};

PyMODINIT_FUNC PyInit__colscan(void) { return PyModule_Create(&module); }
