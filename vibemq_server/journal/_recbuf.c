/* The journal's per-message records (PUBLISH without headers, DELIVER, SETTLE) encoded straight
 * into one growing buffer per write batch: the prefix (length, CRC-32), the head's fields and
 * the payload written in place, the CRC taken over the record where it lies. In Python each
 * record was a Struct.pack, one or two zlib.crc32 calls and a join, some 3,000 instructions of
 * CPython's generic machinery a record (docs/performance.md, issue 15); here a record is one
 * call. The bytes are exactly those of vibemq_server/journal/records.py (docs/journal.md); the
 * pure equivalent is journal/batch.py's PyRecordBuffer, and a Hypothesis test compares the two.
 *
 * The CRC-32 is zlib's (IEEE polynomial, reflected, as zlib.crc32), computed here by slicing
 * by 8 with tables made at import: zlib's own crc32 goes byte by byte under 47 bytes and costs a
 * call through the PLT, and these records are 40-200 bytes (no link dependency either); where
 * the CPU has PCLMULQDQ and SSSE3, every record of 16 bytes or more is folded whole instead
 * (crc32_fold_any).
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "../_cext/common.h"

#define PUBLISH 3
#define DELIVER 4
#define SETTLE 5

static uint32_t crc_tables[8][256];

static void make_crc_tables(void) {
    for (uint32_t n = 0; n < 256; n++) {
        uint32_t c = n;
        for (int k = 0; k < 8; k++)
            c = c & 1 ? 0xEDB88320u ^ (c >> 1) : c >> 1;
        crc_tables[0][n] = c;
    }
    for (uint32_t n = 0; n < 256; n++) {
        uint32_t c = crc_tables[0][n];
        for (int t = 1; t < 8; t++) {
            c = crc_tables[0][c & 0xFF] ^ (c >> 8);
            crc_tables[t][n] = c;
        }
    }
}

/* The running (inverted) CRC-32 state `c` over `n` more bytes, eight bytes a step. */
static uint32_t crc32_walk(uint32_t c, const unsigned char *p, size_t n) {
    while (n >= 8) {
        uint32_t lo = c ^ ((uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 |
                           (uint32_t)p[3] << 24);
        uint32_t hi = (uint32_t)p[4] | (uint32_t)p[5] << 8 | (uint32_t)p[6] << 16 |
                      (uint32_t)p[7] << 24;
        c = crc_tables[7][lo & 0xFF] ^ crc_tables[6][(lo >> 8) & 0xFF] ^
            crc_tables[5][(lo >> 16) & 0xFF] ^ crc_tables[4][lo >> 24] ^
            crc_tables[3][hi & 0xFF] ^ crc_tables[2][(hi >> 8) & 0xFF] ^
            crc_tables[1][(hi >> 16) & 0xFF] ^ crc_tables[0][hi >> 24];
        p += 8;
        n -= 8;
    }
    while (n--)
        c = crc_tables[0][(c ^ *p++) & 0xFF] ^ (c >> 8);
    return c;
}

#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
/* The same CRC folded 16 bytes a step with carry-less multiplies (PCLMULQDQ; Intel's "Fast CRC
 * Computation for Generic Polynomials Using PCLMULQDQ", the reflected IEEE polynomial's
 * constants as in Linux's crc32-pclmul and Chromium's zlib): a record's ~130 bytes cost some
 * 60 instructions instead of the tables' ~450 (issue 15: the CRC was the durable path's largest
 * single cost). Used when the CPU has it (checked once at import). */
#include <immintrin.h>
#define VMQ_CLMUL 1
static int have_clmul;

#define CLMUL_TARGET __attribute__((target("pclmul,sse2,ssse3")))

CLMUL_TARGET static inline __m128i fold16(__m128i x, __m128i k, __m128i next) {
    __m128i lo = _mm_clmulepi64_si128(x, k, 0x00);
    __m128i hi = _mm_clmulepi64_si128(x, k, 0x11);
    return _mm_xor_si128(_mm_xor_si128(lo, hi), next);
}

#define LOAD16(p) _mm_loadu_si128((const __m128i *)(const void *)(p))

/* The running state after a first block `x1` (the state already XORed into its first four
 * bytes) and the `n` bytes at `p`, `n` a multiple of 16 (0 too). */
CLMUL_TARGET static uint32_t crc32_fold(__m128i x1, const unsigned char *p, size_t n) {
    const __m128i k1k2 = _mm_set_epi64x(0x01c6e41596LL, 0x0154442bd4LL);
    const __m128i k3k4 = _mm_set_epi64x(0x00ccaa009eLL, 0x01751997d0LL);
    const __m128i k5 = _mm_set_epi64x(0, 0x0163cd6124LL);
    const __m128i poly = _mm_set_epi64x(0x01f7011641LL, 0x01db710641LL);
    const __m128i low32 = _mm_setr_epi32(-1, 0, -1, 0);
    if (n >= 48) { /* four lanes, 64 bytes a step, then folded into one */
        __m128i x2 = LOAD16(p), x3 = LOAD16(p + 16), x4 = LOAD16(p + 32);
        p += 48;
        n -= 48;
        while (n >= 64) {
            x1 = fold16(x1, k1k2, LOAD16(p));
            x2 = fold16(x2, k1k2, LOAD16(p + 16));
            x3 = fold16(x3, k1k2, LOAD16(p + 32));
            x4 = fold16(x4, k1k2, LOAD16(p + 48));
            p += 64;
            n -= 64;
        }
        x1 = fold16(x1, k3k4, x2);
        x1 = fold16(x1, k3k4, x3);
        x1 = fold16(x1, k3k4, x4);
    }
    while (n >= 16) {
        x1 = fold16(x1, k3k4, LOAD16(p));
        p += 16;
        n -= 16;
    }
    /* 128 bits to 64, then Barrett's reduction to 32 */
    __m128i x2 = _mm_clmulepi64_si128(x1, k3k4, 0x10);
    x1 = _mm_xor_si128(_mm_srli_si128(x1, 8), x2);
    x2 = _mm_srli_si128(x1, 4);
    x1 = _mm_clmulepi64_si128(_mm_and_si128(x1, low32), k5, 0x00);
    x1 = _mm_xor_si128(x1, x2);
    x2 = _mm_clmulepi64_si128(_mm_and_si128(x1, low32), poly, 0x10);
    x2 = _mm_clmulepi64_si128(_mm_and_si128(x2, low32), poly, 0x00);
    x1 = _mm_xor_si128(x1, x2);
    return (uint32_t)_mm_cvtsi128_si32(_mm_srli_si128(x1, 4));
}

/* A length not a multiple of 16 (most records: 29 to 40 bytes for a DELIVER or a SETTLE) is
 * folded whole as if `k` zero bytes came first, rather than walking its last bytes through the
 * tables (~70 instructions a record): zero bytes leave a state of 0 at 0, so the fold starts
 * from the state that `k` zero bytes turn into the CRC's initial 0xFFFFFFFF (before_zeros[k],
 * made at import), and its first block is the first 16 - k bytes shifted right by `k` (one
 * PSHUFB with a mask from shift_in). The same CRC, zlib's. */
static uint32_t before_zeros[16];
static const unsigned char shift_in[32] = {
    0x80, 0x80, 0x80, 0x80, 0x80, 0x80, 0x80, 0x80, 0x80, 0x80, 0x80, 0x80, 0x80, 0x80, 0x80, 0x80,
    0,    1,    2,    3,    4,    5,    6,    7,    8,    9,    10,   11,   12,   13,   14,   15};

static void make_before_zeros(void) {
    uint32_t c = 0xFFFFFFFFu;
    before_zeros[0] = c;
    for (int k = 1; k < 16; k++) {
        /* one zero byte backwards: c = T[s & 0xFF] ^ (s >> 8), and the top bytes of the
         * table's 256 entries differ, so the one whose top byte is c's names s's low byte */
        int i = 0;
        while ((crc_tables[0][i] >> 24) != (c >> 24))
            i++;
        c = ((c ^ crc_tables[0][i]) << 8) | (uint32_t)i;
        before_zeros[k] = c;
    }
}

/* The running state over `n` bytes, at least 16, from the initial state. */
CLMUL_TARGET static uint32_t crc32_fold_any(const unsigned char *p, size_t n) {
    size_t r = n & 15, k = (16 - r) & 15;
    __m128i first = LOAD16(p);
    if (k)
        first = _mm_shuffle_epi8(first, LOAD16(shift_in + 16 - k));
    first = _mm_xor_si128(first, _mm_cvtsi32_si128((int)before_zeros[k]));
    size_t head = k ? r : 16;
    return crc32_fold(first, p + head, n - head);
}
#endif

/* zlib.crc32(data) (from 0). */
static uint32_t crc32_of(const unsigned char *p, size_t n) {
#ifdef VMQ_CLMUL
    if (have_clmul && n >= 16)
        return crc32_fold_any(p, n) ^ 0xFFFFFFFFu;
#endif
    return crc32_walk(0xFFFFFFFFu, p, n) ^ 0xFFFFFFFFu;
}

typedef struct {
    PyObject_HEAD
    unsigned char *buf;
    Py_ssize_t len;
    size_t cap;
    uint64_t ts; /* the DELIVER and SETTLE records' timestamp (stamp()) */
    /* the PUBLISH records' fixed fields (fields()): a publish passes only what is its own */
    uint64_t published_at, expires_at;
    unsigned int priority, attempts;
    uint64_t seq; /* the next PUBLISH record's seq (seq(); one more after each publish) */
} RecordBuffer;

static int reserve(RecordBuffer *self, Py_ssize_t more) {
    if (more > PY_SSIZE_T_MAX - self->len) {
        PyErr_NoMemory();
        return -1;
    }
    return vmq_grow((void **)&self->buf, &self->cap, (size_t)(self->len + more), 1, 64 * 1024);
}

static inline unsigned char *put16(unsigned char *p, unsigned int v) {
    p[0] = (unsigned char)(v >> 8);
    p[1] = (unsigned char)v;
    return p + 2;
}

static inline unsigned char *put32(unsigned char *p, uint32_t v) {
    p[0] = (unsigned char)(v >> 24);
    p[1] = (unsigned char)(v >> 16);
    p[2] = (unsigned char)(v >> 8);
    p[3] = (unsigned char)v;
    return p + 4;
}

static inline unsigned char *put64(unsigned char *p, uint64_t v) {
    put32(p, (uint32_t)(v >> 32));
    return put32(p + 4, (uint32_t)v);
}

/* An unsigned int argument of at most `max` (a u64, u16 or u8 field: what struct.pack refuses
 * is refused here too, with OverflowError). */
static int take_uint(PyObject *arg, uint64_t max, const char *what, uint64_t *out) {
    if (!PyLong_Check(arg)) {
        PyErr_Format(PyExc_TypeError, "%s must be an int", what);
        return -1;
    }
    unsigned long long v = PyLong_AsUnsignedLongLong(arg);
    if (v == (unsigned long long)-1 && PyErr_Occurred())
        return -1;
    if (v > max) {
        PyErr_Format(PyExc_OverflowError, "%s out of range", what);
        return -1;
    }
    *out = v;
    return 0;
}

/* A u64 the buffer keeps (seq(), stamp()): left as it was when the argument is refused. */
static PyObject *set_u64(PyObject *arg, const char *what, uint64_t *field) {
    uint64_t v;
    if (take_uint(arg, UINT64_MAX, what, &v) < 0)
        return NULL;
    *field = v;
    Py_RETURN_NONE;
}

/* A str16 field given as UTF-8 of at most 65535 bytes (a str, or bytes already encoded). */
static int take_text(PyObject *arg, const char *what, const char **data, Py_ssize_t *size) {
    if (PyUnicode_Check(arg)) {
        *data = PyUnicode_AsUTF8AndSize(arg, size);
        if (*data == NULL)
            return -1;
    } else {
        PyErr_Format(PyExc_TypeError, "%s must be a str", what);
        return -1;
    }
    if (*size > 0xFFFF) {
        PyErr_Format(PyExc_OverflowError, "%s longer than 65535 bytes", what);
        return -1;
    }
    return 0;
}

/* The queue's name as records.py's str16 (u16 length, UTF-8), made once per queue. */
static int take_name16(PyObject *arg, const char **data, Py_ssize_t *size) {
    if (!PyBytes_Check(arg)) {
        PyErr_SetString(PyExc_TypeError, "name16 must be bytes");
        return -1;
    }
    *data = PyBytes_AS_STRING(arg);
    *size = PyBytes_GET_SIZE(arg);
    if (*size < 2 || *size > 0xFFFF + 2 ||
        ((((unsigned char)(*data)[0]) << 8) | (unsigned char)(*data)[1]) != *size - 2) {
        PyErr_SetString(PyExc_ValueError, "name16 must be a u16 length and that many bytes");
        return -1;
    }
    return 0;
}

/* Finish the record that starts at `start` and ends at `end`: its length and CRC-32. */
static void seal(RecordBuffer *self, Py_ssize_t start, unsigned char *end) {
    unsigned char *rec = self->buf + start;
    unsigned char *inner = rec + 8;
    size_t n = (size_t)(end - inner);
    put32(rec, (uint32_t)n);
    put32(rec + 4, crc32_of(inner, n));
    self->len = end - self->buf;
}

/* fields(published_at, expires_at, priority, attempts): the fixed fields of the PUBLISH records
 * appended from now on (the timestamp is published_at, as the journal always wrote it). The
 * messages of one clock tick share them: the journal passes them when they change, not the four
 * ints boxed for every publish (issue 15: ~500 instructions a durable publish). All four are
 * checked before any is kept, so a refused call leaves the last ones. */
static PyObject *rb_fields(RecordBuffer *self, PyObject *const *args, Py_ssize_t nargs) {
    if (vmq_nargs(nargs, 4, "fields") < 0)
        return NULL;
    uint64_t published_at, expires_at, priority, attempts;
    if (take_uint(args[0], UINT64_MAX, "published_at", &published_at) < 0 ||
        take_uint(args[1], UINT64_MAX, "expires_at", &expires_at) < 0 ||
        take_uint(args[2], 0xFF, "priority", &priority) < 0 ||
        take_uint(args[3], 0xFFFF, "attempts", &attempts) < 0)
        return NULL;
    self->published_at = published_at;
    self->expires_at = expires_at;
    self->priority = (unsigned int)priority;
    self->attempts = (unsigned int)attempts;
    Py_RETURN_NONE;
}

/* seq(seq): the seq of the next PUBLISH record (each publish takes it and counts one on). A
 * client's publishes get consecutive seqs: the journal passes one when it does not follow on,
 * not a boxed seq a publish. */
static PyObject *rb_seq(RecordBuffer *self, PyObject *arg) {
    return set_u64(arg, "seq", &self->seq);
}

/* publish(name16, message_id, payload): a PUBLISH record without headers (records.py writes
 * those), its seq the next one (seq()) and its fixed fields the last fields() gave. A refused
 * call appends nothing and leaves the next seq as it was. */
static PyObject *rb_publish(RecordBuffer *self, PyObject *const *args, Py_ssize_t nargs) {
    if (vmq_nargs(nargs, 3, "publish") < 0)
        return NULL;
    const char *name, *mid;
    Py_ssize_t name_len, mid_len;
    if (take_name16(args[0], &name, &name_len) < 0 ||
        take_text(args[1], "message_id", &mid, &mid_len) < 0)
        return NULL;
    /* (bytes, the journal's payloads, read in place: a buffer request and its release cost
     * ~70 instructions a publish; any other bytes-like object through the buffer protocol) */
    Py_buffer view;
    view.obj = NULL;
    if (PyBytes_CheckExact(args[2])) {
        view.buf = PyBytes_AS_STRING(args[2]);
        view.len = PyBytes_GET_SIZE(args[2]);
    } else if (PyObject_GetBuffer(args[2], &view, PyBUF_SIMPLE) < 0) {
        return NULL;
    }
    if ((uint64_t)view.len > UINT32_MAX - 64 - (uint64_t)name_len - (uint64_t)mid_len) {
        PyBuffer_Release(&view);
        PyErr_SetString(PyExc_OverflowError, "payload too large for a record");
        return NULL;
    }
    /* prefix 8, type 1, 4 x u64, u8, u16, name16, u16 + id, u16 headers, u32 payload length */
    Py_ssize_t size = 8 + 1 + 32 + 1 + 2 + name_len + 2 + mid_len + 2 + 4 + view.len;
    if (reserve(self, size) < 0) {
        PyBuffer_Release(&view);
        return NULL;
    }
    Py_ssize_t start = self->len;
    unsigned char *p = self->buf + start + 8;
    *p++ = PUBLISH;
    p = put64(p, self->published_at);
    p = put64(p, self->seq++); /* (wraps at 2^64 as the pure one's does) */
    p = put64(p, self->published_at);
    p = put64(p, self->expires_at);
    *p++ = (unsigned char)self->priority;
    p = put16(p, self->attempts);
    memcpy(p, name, (size_t)name_len);
    p += name_len;
    p = put16(p, (unsigned int)mid_len);
    memcpy(p, mid, (size_t)mid_len);
    p += mid_len;
    p = put16(p, 0);
    p = put32(p, (uint32_t)view.len);
    memcpy(p, view.buf, (size_t)view.len);
    p += view.len;
    PyBuffer_Release(&view); /* (nothing when view.obj is NULL) */
    seal(self, start, p);
    Py_RETURN_NONE;
}

/* stamp(timestamp): the timestamp of the DELIVER and SETTLE records appended from now on (the
 * journal reads the clock once a write batch: passed once, not boxed again for every record). */
static PyObject *rb_stamp(RecordBuffer *self, PyObject *arg) {
    return set_u64(arg, "timestamp", &self->ts);
}

static int put_deliver(RecordBuffer *self, const char *name, Py_ssize_t name_len, uint64_t seq,
                       uint64_t attempts) {
    if (reserve(self, 8 + 1 + 16 + 2 + name_len) < 0)
        return -1;
    Py_ssize_t start = self->len;
    unsigned char *p = self->buf + start + 8;
    *p++ = DELIVER;
    p = put64(p, self->ts);
    p = put64(p, seq);
    p = put16(p, (unsigned int)attempts);
    memcpy(p, name, (size_t)name_len);
    seal(self, start, p + name_len);
    return 0;
}

static int put_settle(RecordBuffer *self, const char *name, Py_ssize_t name_len, uint64_t seq,
                      uint64_t reason, const char *detail, Py_ssize_t detail_len) {
    if (reserve(self, 8 + 1 + 16 + 1 + name_len + 2 + detail_len) < 0)
        return -1;
    Py_ssize_t start = self->len;
    unsigned char *p = self->buf + start + 8;
    *p++ = SETTLE;
    p = put64(p, self->ts);
    p = put64(p, seq);
    *p++ = (unsigned char)reason;
    memcpy(p, name, (size_t)name_len);
    p += name_len;
    p = put16(p, (unsigned int)detail_len);
    memcpy(p, detail, (size_t)detail_len);
    seal(self, start, p + detail_len);
    return 0;
}

/* deliver_run's and settle_run's records, (name16, first, count, value): the value a DELIVER's
 * attempts or a SETTLE's reason; at most 2^32 - 1 records, the last seq within a u64; the
 * room reserved once, so a refused call appends nothing. */
static PyObject *put_run(RecordBuffer *self, PyObject *const *args, Py_ssize_t nargs, int settle) {
    const char *name;
    Py_ssize_t name_len;
    uint64_t first, count, value;
    if (vmq_nargs(nargs, 4, settle ? "settle_run" : "deliver_run") < 0 ||
        take_name16(args[0], &name, &name_len) < 0 ||
        take_uint(args[1], UINT64_MAX, "seq", &first) < 0 ||
        take_uint(args[2], UINT32_MAX, "count", &count) < 0 ||
        take_uint(args[3], settle ? 0xFF : 0xFFFF, settle ? "reason" : "attempts", &value) < 0)
        return NULL;
    if (count && first > UINT64_MAX - (count - 1)) {
        PyErr_SetString(PyExc_OverflowError, "seq out of range");
        return NULL;
    }
    /* a DELIVER: prefix 8, type 1, 2 x u64, u16, name16; a SETTLE: a u8 and an empty str16 */
    if (count && reserve(self, (Py_ssize_t)count * ((settle ? 28 : 27) + name_len)) < 0)
        return NULL;
    for (uint64_t i = 0; i < count; i++) { /* (room reserved: neither can fail) */
        if (settle)
            put_settle(self, name, name_len, first + i, value, "", 0);
        else
            put_deliver(self, name, name_len, first + i, value);
    }
    Py_RETURN_NONE;
}

/* deliver_run(name16, first, count, attempts): a DELIVER record for each of the seqs first ..
 * first + count - 1, in order, all with the same attempts, at the stamped timestamp (the
 * journal gathers a loop turn's consecutive deliveries of a queue: one call, not one a
 * message with its seq boxed). */
static PyObject *rb_deliver_run(RecordBuffer *self, PyObject *const *args, Py_ssize_t nargs) {
    return put_run(self, args, nargs, 0);
}

/* settle(name16, seq, reason, detail): at the stamped timestamp */
static PyObject *rb_settle(RecordBuffer *self, PyObject *const *args, Py_ssize_t nargs) {
    if (vmq_nargs(nargs, 4, "settle") < 0)
        return NULL;
    const char *name, *detail;
    Py_ssize_t name_len, detail_len;
    uint64_t seq, reason;
    if (take_name16(args[0], &name, &name_len) < 0 ||
        take_uint(args[1], UINT64_MAX, "seq", &seq) < 0 ||
        take_uint(args[2], 0xFF, "reason", &reason) < 0 ||
        take_text(args[3], "detail", &detail, &detail_len) < 0)
        return NULL;
    if (put_settle(self, name, name_len, seq, reason, detail, detail_len) < 0)
        return NULL;
    Py_RETURN_NONE;
}

/* settle_all(name16, seqs, reason): one SETTLE record (no detail) for each seq of the list, in
 * order, at the stamped timestamp (a read's acks: one call, not one per message). A bad seq
 * leaves the batch as it was. */
static PyObject *rb_settle_all(RecordBuffer *self, PyObject *const *args, Py_ssize_t nargs) {
    if (vmq_nargs(nargs, 3, "settle_all") < 0)
        return NULL;
    const char *name;
    Py_ssize_t name_len;
    uint64_t seq, reason;
    if (take_name16(args[0], &name, &name_len) < 0 ||
        take_uint(args[2], 0xFF, "reason", &reason) < 0)
        return NULL;
    PyObject *seqs = args[1];
    if (!PyList_Check(seqs)) {
        PyErr_SetString(PyExc_TypeError, "seqs must be a list");
        return NULL;
    }
    Py_ssize_t n = PyList_GET_SIZE(seqs);
    if (n && reserve(self, n * (8 + 1 + 16 + 1 + name_len + 2)) < 0)
        return NULL;
    /* one pass: a bad seq takes back what this call appended (the room is reserved) */
    Py_ssize_t start = self->len;
    for (Py_ssize_t i = 0; i < n; i++) {
        if (take_uint(PyList_GET_ITEM(seqs, i), UINT64_MAX, "seq", &seq) < 0 ||
            put_settle(self, name, name_len, seq, reason, "", 0) < 0) {
            self->len = start;
            return NULL;
        }
    }
    Py_RETURN_NONE;
}

/* settle_run(name16, first, count, reason): settle_all of the seqs first .. first + count - 1
 * (a read's acks of consecutive deliveries: no list of boxed seqs). */
static PyObject *rb_settle_run(RecordBuffer *self, PyObject *const *args, Py_ssize_t nargs) {
    return put_run(self, args, nargs, 1);
}

/* Memory kept between batches at most: a burst of large batches does not pin its peak. */
#define KEEP_CAP (4 * 1024 * 1024)

/* take() -> bytes: the records gathered so far; the buffer starts over (its memory kept, up to
 * KEEP_CAP). */
static PyObject *rb_take(RecordBuffer *self, PyObject *Py_UNUSED(ignored)) {
    PyObject *out = PyBytes_FromStringAndSize((const char *)self->buf, self->len);
    if (out == NULL)
        return NULL;
    self->len = 0;
    if (self->cap > KEEP_CAP) {
        PyMem_Free(self->buf);
        self->buf = NULL;
        self->cap = 0;
    }
    return out;
}

static Py_ssize_t rb_length(RecordBuffer *self) {
    return self->len;
}

static PyObject *rb_new(PyTypeObject *type, PyObject *args, PyObject *kwds) {
    if (PyTuple_GET_SIZE(args) || (kwds != NULL && PyDict_GET_SIZE(kwds))) {
        PyErr_SetString(PyExc_TypeError, "RecordBuffer() takes no arguments");
        return NULL;
    }
    RecordBuffer *self = (RecordBuffer *)type->tp_alloc(type, 0);
    if (self != NULL) {
        self->buf = NULL;
        self->len = 0;
        self->cap = 0;
        self->ts = 0;
        self->published_at = self->expires_at = 0;
        self->priority = self->attempts = 0;
        self->seq = 0;
    }
    return (PyObject *)self;
}

static void rb_dealloc(RecordBuffer *self) {
    PyMem_Free(self->buf);
    Py_TYPE(self)->tp_free((PyObject *)self);
}

static PyMethodDef rb_methods[] = {
    {"fields", (PyCFunction)(void (*)(void))rb_fields, METH_FASTCALL,
     "fields(published_at, expires_at, priority, attempts) -> None: the fixed fields of the "
     "PUBLISH records from now on (their timestamp published_at)."},
    {"seq", (PyCFunction)rb_seq, METH_O,
     "seq(seq) -> None: the seq of the next PUBLISH record (one more after each)."},
    {"publish", (PyCFunction)(void (*)(void))rb_publish, METH_FASTCALL,
     "publish(name16, message_id, payload) -> None: a PUBLISH record without headers "
     "appended, with the next seq and the last fields()."},
    {"stamp", (PyCFunction)rb_stamp, METH_O,
     "stamp(timestamp) -> None: the timestamp of the DELIVER and SETTLE records from now on."},
    {"deliver_run", (PyCFunction)(void (*)(void))rb_deliver_run, METH_FASTCALL,
     "deliver_run(name16, first, count, attempts) -> None: a DELIVER record for each of the "
     "seqs first .. first + count - 1."},
    {"settle", (PyCFunction)(void (*)(void))rb_settle, METH_FASTCALL,
     "settle(name16, seq, reason, detail) -> None: a SETTLE record appended."},
    {"settle_all", (PyCFunction)(void (*)(void))rb_settle_all, METH_FASTCALL,
     "settle_all(name16, seqs, reason) -> None: a SETTLE record (no detail) for each seq."},
    {"settle_run", (PyCFunction)(void (*)(void))rb_settle_run, METH_FASTCALL,
     "settle_run(name16, first, count, reason) -> None: settle_all of the seqs first .. "
     "first + count - 1."},
    {"take", (PyCFunction)rb_take, METH_NOARGS,
     "take() -> bytes: the records appended since the last take, and the buffer emptied."},
    {NULL, NULL, 0, NULL},
};

static PySequenceMethods rb_as_sequence = {
    .sq_length = (lenfunc)rb_length,
};

static PyTypeObject RecordBufferType = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "vibemq_server.journal._recbuf.RecordBuffer",
    .tp_basicsize = sizeof(RecordBuffer),
    .tp_flags = Py_TPFLAGS_DEFAULT,
    .tp_doc = "A write batch's journal records, encoded in place (len(): bytes gathered).",
    .tp_new = rb_new,
    .tp_dealloc = (destructor)rb_dealloc,
    .tp_methods = rb_methods,
    .tp_as_sequence = &rb_as_sequence,
};


/* ---- the queue index of a sealed segment (journal/qindex.py: build) ----
 * The same walk as qindex.build's Python loop: each record's length, CRC-32, type and queue name
 * checked, the records of one queue gathered as byte ranges (adjacent ones coalesced) with their
 * time span. The walk runs with the GIL released (it reads only the caller's bytes), so the
 * broker's event loop is not held up while a 64 MiB segment is indexed; the Python loop cost
 * ~1.8 us a record under the GIL, as much CPU as the durable publishes that filled it. */

typedef struct {
    const unsigned char *name;
    size_t name_len;
    uint64_t hash;
    uint64_t min_ts, max_ts;
    uint64_t *ranges; /* [start, end) pairs */
    size_t count, cap;
} QSpans;

typedef struct {
    QSpans *items;
    size_t len, cap;
    size_t *slots; /* 1 + index into items, 0 = empty; a power of two */
    size_t nslots;
} QTable;

static uint64_t name_hash(const unsigned char *p, size_t n) {
    uint64_t h = 1469598103934665603ULL;
    for (size_t i = 0; i < n; i++)
        h = (h ^ p[i]) * 1099511628211ULL;
    return h;
}

static int qt_grow(QTable *t) {
    size_t nslots = t->nslots ? t->nslots * 2 : 64;
    size_t *slots = calloc(nslots, sizeof(size_t));
    if (slots == NULL)
        return -1;
    for (size_t i = 0; i < t->len; i++) {
        size_t at = (size_t)t->items[i].hash & (nslots - 1);
        while (slots[at])
            at = (at + 1) & (nslots - 1);
        slots[at] = i + 1;
    }
    free(t->slots);
    t->slots = slots;
    t->nslots = nslots;
    return 0;
}

static QSpans *qt_get(QTable *t, const unsigned char *name, size_t n) {
    uint64_t h = name_hash(name, n);
    if (t->nslots) {
        size_t at = (size_t)h & (t->nslots - 1);
        while (t->slots[at]) {
            QSpans *q = &t->items[t->slots[at] - 1];
            if (q->hash == h && q->name_len == n && memcmp(q->name, name, n) == 0)
                return q;
            at = (at + 1) & (t->nslots - 1);
        }
    }
    if ((t->len + 1) * 2 > t->nslots && qt_grow(t) < 0)
        return NULL;
    if (t->len == t->cap) {
        size_t cap = t->cap ? t->cap * 2 : 16;
        QSpans *items = realloc(t->items, cap * sizeof(QSpans));
        if (items == NULL)
            return NULL;
        t->items = items;
        t->cap = cap;
    }
    QSpans *q = &t->items[t->len];
    memset(q, 0, sizeof *q);
    q->name = name;
    q->name_len = n;
    q->hash = h;
    size_t at = (size_t)h & (t->nslots - 1);
    while (t->slots[at])
        at = (at + 1) & (t->nslots - 1);
    t->slots[at] = ++t->len;
    return q;
}

static void qt_free(QTable *t) {
    for (size_t i = 0; i < t->len; i++)
        free(t->items[i].ranges);
    free(t->items);
    free(t->slots);
}

static inline uint32_t get32(const unsigned char *p) {
    return ((uint32_t)p[0] << 24) | ((uint32_t)p[1] << 16) | ((uint32_t)p[2] << 8) | p[3];
}

static inline uint64_t get64(const unsigned char *p) {
    return ((uint64_t)get32(p) << 32) | get32(p + 4);
}

#define RECORD_MIN_LENGTH 9
#define RECORD_MAX_LENGTH (384u * 1024u * 1024u)

/* qindex._is_tail: the bad record at pos is cut off or zero-filled */
static int is_tail(const unsigned char *d, size_t size, size_t pos) {
    if (size - pos < 8)
        return 1;
    uint32_t length = get32(d + pos);
    if (length > RECORD_MAX_LENGTH || pos + 8 + (size_t)length >= size)
        return 1;
    for (size_t i = pos; i < size; i++)
        if (d[i])
            return 0;
    return 1;
}

/* status: 0 whole (a tail may follow end), 1 damaged in the middle, -1 out of memory */
static int index_walk(const unsigned char *d, size_t size, size_t pos, const unsigned char *queue_at,
                      QTable *t, size_t *end_out, uint32_t *first_crc, uint64_t *last_offset,
                      uint32_t *last_crc) {
    QSpans *last_q = NULL;
    while (pos < size) {
        int good = 0;
        size_t end = 0;
        uint32_t crc = 0;
        uint64_t ts = 0;
        const unsigned char *name = NULL;
        size_t name_len = 0;
        if (size - pos >= 17) {
            uint32_t length = get32(d + pos);
            crc = get32(d + pos + 4);
            unsigned kind = d[pos + 8];
            ts = get64(d + pos + 9);
            end = pos + 8 + (size_t)length;
            size_t at = pos + queue_at[kind];
            if (queue_at[kind] && length >= RECORD_MIN_LENGTH && length <= RECORD_MAX_LENGTH &&
                end <= size && at + 2 <= end) {
                name_len = ((size_t)d[at] << 8) | d[at + 1];
                name = d + at + 2;
                good = at + 2 + name_len <= end && crc32_of(d + pos + 8, length) == crc;
            }
        }
        if (!good) {
            if (is_tail(d, size, pos))
                break;
            return 1;
        }
        QSpans *q = last_q;
        if (q == NULL || q->name_len != name_len || memcmp(q->name, name, name_len) != 0) {
            q = qt_get(t, name, name_len);
            if (q == NULL)
                return -1;
            last_q = q;
        }
        if (q->count == 0) {
            q->min_ts = q->max_ts = ts;
        } else if (ts < q->min_ts) {
            q->min_ts = ts;
        } else if (ts > q->max_ts) {
            q->max_ts = ts;
        }
        if (q->count && q->ranges[2 * q->count - 1] == pos) {
            q->ranges[2 * q->count - 1] = end; /* right after this queue's previous record */
        } else {
            if (q->count == q->cap) {
                size_t cap = q->cap ? q->cap * 2 : 8;
                uint64_t *r = realloc(q->ranges, cap * 2 * sizeof(uint64_t));
                if (r == NULL)
                    return -1;
                q->ranges = r;
                q->cap = cap;
            }
            q->ranges[2 * q->count] = pos;
            q->ranges[2 * q->count + 1] = end;
            q->count++;
        }
        if (*last_offset == 0)
            *first_crc = crc;
        *last_offset = pos;
        *last_crc = crc;
        pos = end;
    }
    *end_out = pos;
    return 0;
}

static const char index_scan_doc[] =
    "index_scan(data, pos, queue_at) -> (damaged, end, first_crc, last_offset, last_crc, queues):\n"
    "the queue index of a segment's records from pos (qindex.build). queue_at: 256 bytes, where\n"
    "the queue's str16 starts in a record of each type (0: no such type). queues: a list of\n"
    "(name bytes, min ts, max ts, range count, ranges as big-endian u64 pairs). damaged: a bad\n"
    "record with records after it (no index); a cut or zero-filled tail ends the walk at end.";

static PyObject *index_scan(PyObject *self, PyObject *args) {
    (void)self;
    Py_buffer view, table;
    Py_ssize_t start;
    if (!PyArg_ParseTuple(args, "y*ny*", &view, &start, &table))
        return NULL;
    PyObject *out = NULL;
    if (table.len != 256 || start < 0 || start > view.len) {
        PyErr_SetString(PyExc_ValueError, "index_scan: queue_at must be 256 bytes, pos in data");
        goto done;
    }
    QTable t = {0};
    size_t end = 0;
    uint32_t first_crc = 0, last_crc = 0;
    uint64_t last_offset = 0;
    int status;
    Py_BEGIN_ALLOW_THREADS
    status = index_walk(view.buf, (size_t)view.len, (size_t)start, table.buf, &t, &end, &first_crc,
                        &last_offset, &last_crc);
    Py_END_ALLOW_THREADS
    if (status < 0) {
        PyErr_NoMemory();
    } else {
        PyObject *queues = PyList_New(0);
        for (size_t i = 0; queues != NULL && status == 0 && i < t.len; i++) {
            QSpans *q = &t.items[i];
            PyObject *block = PyBytes_FromStringAndSize(NULL, (Py_ssize_t)(q->count * 16));
            if (block == NULL) {
                Py_CLEAR(queues);
                break;
            }
            unsigned char *p = (unsigned char *)PyBytes_AS_STRING(block);
            for (size_t k = 0; k < 2 * q->count; k++)
                p = put64(p, q->ranges[k]);
            PyObject *item = Py_BuildValue("(y#KKnN)", (const char *)q->name,
                                           (Py_ssize_t)q->name_len, (unsigned long long)q->min_ts,
                                           (unsigned long long)q->max_ts, (Py_ssize_t)q->count,
                                           block);
            if (item == NULL || PyList_Append(queues, item) < 0) {
                Py_XDECREF(item);
                Py_CLEAR(queues);
                break;
            }
            Py_DECREF(item);
        }
        if (queues != NULL)
            out = Py_BuildValue("(OnkKkN)", status ? Py_True : Py_False, (Py_ssize_t)end,
                                (unsigned long)first_crc, (unsigned long long)last_offset,
                                (unsigned long)last_crc, queues);
    }
    qt_free(&t);
done:
    PyBuffer_Release(&view);
    PyBuffer_Release(&table);
    return out;
}

static PyMethodDef module_methods[] = {
    {"index_scan", index_scan, METH_VARARGS, index_scan_doc},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {
    PyModuleDef_HEAD_INIT, "_recbuf", "The journal's per-message records, encoded in C.", -1,
    module_methods,
};

PyMODINIT_FUNC PyInit__recbuf(void) {
    static PyTypeObject *const types[] = {&RecordBufferType, NULL};
    make_crc_tables();
#ifdef VMQ_CLMUL
    __builtin_cpu_init();
    have_clmul = __builtin_cpu_supports("pclmul") && __builtin_cpu_supports("ssse3") &&
                 getenv("VIBEMQ_CRC_TABLES") == NULL;
    make_before_zeros();
#endif
    return vmq_module(&module, types);
}
