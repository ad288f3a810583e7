/* Validate a JSON text (RFC 8259, UTF-8) without building anything: the native protocol's
 * payload check (vibemq_server/protocol/jsoncheck.py says what it accepts and why).
 *
 * One pass, no allocation: the nesting is a bit stack (1 = inside an object), bounded at
 * MAX_DEPTH as orjson is. Large inputs are checked with the GIL released, so a 64 MiB payload
 * can be checked in a worker thread while the event loop serves other connections.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stdint.h>
#include <string.h>

#define MAX_DEPTH 1024
/* below this the GIL's release and re-take costs more than it lets others do */
#define NOGIL_FROM (64 * 1024)

typedef struct {
    const unsigned char *p;
    const unsigned char *end;
} cursor;

static inline void skip_ws(cursor *c) {
    while (c->p < c->end) {
        unsigned char b = *c->p;
        if (b != ' ' && b != '\n' && b != '\r' && b != '\t')
            return;
        c->p++;
    }
}

static inline int is_hex(unsigned char b) {
    return (b >= '0' && b <= '9') || ((b | 0x20) >= 'a' && (b | 0x20) <= 'f');
}

/* One UTF-8 sequence starting at a byte >= 0x80 (strict: no overlong forms, no encoded
 * surrogates, nothing above U+10FFFF). */
static inline int utf8_seq(cursor *c) {
    const unsigned char *p = c->p;
    Py_ssize_t left = c->end - p;
    unsigned char b0 = p[0];
    if (b0 >= 0xC2 && b0 <= 0xDF) {
        if (left < 2 || (p[1] & 0xC0) != 0x80)
            return 0;
        c->p += 2;
        return 1;
    }
    if (b0 >= 0xE0 && b0 <= 0xEF) {
        if (left < 3 || (p[1] & 0xC0) != 0x80 || (p[2] & 0xC0) != 0x80)
            return 0;
        if (b0 == 0xE0 && p[1] < 0xA0)
            return 0; /* overlong */
        if (b0 == 0xED && p[1] >= 0xA0)
            return 0; /* U+D800..U+DFFF */
        c->p += 3;
        return 1;
    }
    if (b0 >= 0xF0 && b0 <= 0xF4) {
        if (left < 4 || (p[1] & 0xC0) != 0x80 || (p[2] & 0xC0) != 0x80 ||
            (p[3] & 0xC0) != 0x80)
            return 0;
        if (b0 == 0xF0 && p[1] < 0x90)
            return 0; /* overlong */
        if (b0 == 0xF4 && p[1] >= 0x90)
            return 0; /* above U+10FFFF */
        c->p += 4;
        return 1;
    }
    return 0;
}

/* How many plain bytes (ASCII, not a control character, '"' or '\\') start at p, up to
 * end: a string's common case, skipped in vector-wide steps. SSE2 is in every x86-64; AVX2,
 * or AVX-512 VBMI (a table lookup, 256 bytes a step), is used where the CPU has it (checked
 * once, ``SIMD`` says which); elsewhere eight bytes at a time in a word. */
#if defined(__x86_64__) && defined(__GNUC__)
#include <immintrin.h>
#define PLAIN_SIMD 1

static const unsigned char *plain_sse2(const unsigned char *p, const unsigned char *end) {
    const __m128i quote = _mm_set1_epi8('"');
    const __m128i slash = _mm_set1_epi8('\\');
    const __m128i space = _mm_set1_epi8(0x20);
    while (end - p >= 16) {
        __m128i v = _mm_loadu_si128((const __m128i *)p);
        /* signed compare: bytes >= 0x80 are negative, so "< 0x20" catches them too */
        __m128i bad = _mm_or_si128(_mm_or_si128(_mm_cmpeq_epi8(v, quote), _mm_cmpeq_epi8(v, slash)),
                                   _mm_cmplt_epi8(v, space));
        int mask = _mm_movemask_epi8(bad);
        if (mask)
            return p + __builtin_ctz((unsigned)mask);
        p += 16;
    }
    return p;
}

static int have_avx2 = -1;
/* (VIBEMQ_JSONCHECK_NO_AVX512 set: the AVX2 step, so it is tested and timed on such a CPU too) */
static int have_vbmi = -1;

/* 0x80 at the ASCII bytes that stop a plain run (controls, '"', '\\'), 0 at the others:
 * the 128-byte table VPERMI2B looks each byte's low seven bits up in. */
static const unsigned char STOPS[128] __attribute__((aligned(64))) = {
    0x80, 0x80, 0x80, 0x80, 0x80, 0x80, 0x80, 0x80, 0x80, 0x80, 0x80, 0x80, 0x80, 0x80, 0x80, 0x80,
    0x80, 0x80, 0x80, 0x80, 0x80, 0x80, 0x80, 0x80, 0x80, 0x80, 0x80, 0x80, 0x80, 0x80, 0x80, 0x80,
    [0x22] = 0x80, [0x5c] = 0x80,
};

/* AVX-512 VBMI: one table lookup per 64 bytes instead of three compares and their ORs; the
 * byte itself ORed in, so a byte >= 0x80 (whose low bits index an ASCII entry) stops too.
 * 256 bytes a step with one test each, the step's first stop found only once there is one.
 * Taken by the AVX2 step once a run has gone 64 bytes (most strings of a record end sooner,
 * and the AVX2 compares answer them as before). */
__attribute__((target("avx512f,avx512bw,avx512vbmi"))) static inline __m512i
stops_vbmi(const unsigned char *p, __m512i lo, __m512i hi) {
    __m512i v = _mm512_loadu_si512((const void *)p);
    return _mm512_or_si512(_mm512_permutex2var_epi8(lo, v, hi), v);
}

__attribute__((target("avx512f,avx512bw,avx512vbmi"))) static const unsigned char *
plain_vbmi(const unsigned char *p, const unsigned char *end) {
    uint64_t m;
    const __m512i lo = _mm512_load_si512((const void *)STOPS);
    const __m512i hi = _mm512_load_si512((const void *)(STOPS + 64));
    while (end - p >= 256) {
        __m512i a = stops_vbmi(p, lo, hi), b = stops_vbmi(p + 64, lo, hi);
        __m512i c = stops_vbmi(p + 128, lo, hi), d = stops_vbmi(p + 192, lo, hi);
        if (!_mm512_movepi8_mask(_mm512_or_si512(_mm512_or_si512(a, b), _mm512_or_si512(c, d)))) {
            p += 256;
            continue;
        }
        if ((m = _mm512_movepi8_mask(a)) != 0)
            return p + __builtin_ctzll(m);
        if ((m = _mm512_movepi8_mask(b)) != 0)
            return p + 64 + __builtin_ctzll(m);
        if ((m = _mm512_movepi8_mask(c)) != 0)
            return p + 128 + __builtin_ctzll(m);
        return p + 192 + __builtin_ctzll(_mm512_movepi8_mask(d));
    }
    while (end - p >= 64) {
        if ((m = _mm512_movepi8_mask(stops_vbmi(p, lo, hi))) != 0)
            return p + __builtin_ctzll(m);
        p += 64;
    }
    return plain_sse2(p, end);
}

__attribute__((target("avx2"))) static const unsigned char *plain_avx2(const unsigned char *p,
                                                                       const unsigned char *end) {
    const __m256i quote = _mm256_set1_epi8('"');
    const __m256i slash = _mm256_set1_epi8('\\');
    const __m256i space = _mm256_set1_epi8(0x20);
    while (end - p >= 64) {
        __m256i a = _mm256_loadu_si256((const __m256i *)p);
        __m256i b = _mm256_loadu_si256((const __m256i *)(p + 32));
        /* signed: bytes >= 0x80 are negative, so "0x20 > b" catches them with the controls */
        __m256i bad_a = _mm256_or_si256(
            _mm256_or_si256(_mm256_cmpeq_epi8(a, quote), _mm256_cmpeq_epi8(a, slash)),
            _mm256_cmpgt_epi8(space, a));
        __m256i bad_b = _mm256_or_si256(
            _mm256_or_si256(_mm256_cmpeq_epi8(b, quote), _mm256_cmpeq_epi8(b, slash)),
            _mm256_cmpgt_epi8(space, b));
        if (!_mm256_testz_si256(_mm256_or_si256(bad_a, bad_b), _mm256_or_si256(bad_a, bad_b))) {
            unsigned ma = (unsigned)_mm256_movemask_epi8(bad_a);
            if (ma)
                return p + __builtin_ctz(ma);
            return p + 32 + __builtin_ctz((unsigned)_mm256_movemask_epi8(bad_b));
        }
        p += 64;
        if (have_vbmi > 0 && end - p >= 256)
            return plain_vbmi(p, end);
    }
    return plain_sse2(p, end);
}

static inline const unsigned char *plain_run(const unsigned char *p, const unsigned char *end) {
    if (have_avx2 > 0 && end - p >= 64)
        return plain_avx2(p, end);
    return plain_sse2(p, end);
}
#else
#define PLAIN_SIMD 0

static inline const unsigned char *plain_run(const unsigned char *p, const unsigned char *end) {
    while (end - p >= 8) {
        uint64_t w;
        memcpy(&w, p, 8);
        /* any byte >= 0x80, < 0x20, '"' or '\\' stops the fast path */
        uint64_t high = w & 0x8080808080808080ULL;
        uint64_t ctrl = (w - 0x2020202020202020ULL) & ~w & 0x8080808080808080ULL;
        uint64_t q = w ^ 0x2222222222222222ULL;
        uint64_t quote = (q - 0x0101010101010101ULL) & ~q & 0x8080808080808080ULL;
        uint64_t s = w ^ 0x5C5C5C5C5C5C5C5CULL;
        uint64_t slash = (s - 0x0101010101010101ULL) & ~s & 0x8080808080808080ULL;
        if (high | ctrl | quote | slash)
            break;
        p += 8;
    }
    return p;
}
#endif

/* A string, the opening quote already consumed. */
static int string(cursor *c) {
    const unsigned char *end = c->end;
    for (;;) {
        c->p = plain_run(c->p, end);
        while (c->p < end && *c->p >= 0x20 && *c->p < 0x80 && *c->p != '"' && *c->p != '\\')
            c->p++; /* the last few bytes, or past what stopped the word-wide step */
        if (c->p >= end)
            return 0;
        unsigned char b = *c->p;
        if (b == '"') {
            c->p++;
            return 1;
        }
        if (b == '\\') {
            if (end - c->p < 2)
                return 0;
            unsigned char e = c->p[1];
            if (e == 'u') {
                if (end - c->p < 6 || !is_hex(c->p[2]) || !is_hex(c->p[3]) ||
                    !is_hex(c->p[4]) || !is_hex(c->p[5]))
                    return 0;
                c->p += 6; /* any code unit, a lone surrogate too: the grammar allows it */
                continue;
            }
            if (e == '"' || e == '\\' || e == '/' || e == 'b' || e == 'f' || e == 'n' ||
                e == 'r' || e == 't') {
                c->p += 2;
                continue;
            }
            return 0;
        }
        if (b < 0x20)
            return 0;
        if (b < 0x80) {
            c->p++;
            continue;
        }
        if (!utf8_seq(c))
            return 0;
    }
}

static inline int digits(cursor *c) {
    const unsigned char *start = c->p;
    while (c->p < c->end && *c->p >= '0' && *c->p <= '9')
        c->p++;
    return c->p > start;
}

/* -?(0|[1-9][0-9]*)(\.[0-9]+)?([eE][+-]?[0-9]+)? of any length (big numbers are valid) */
static int number(cursor *c) {
    if (*c->p == '-')
        c->p++;
    if (c->p >= c->end)
        return 0;
    if (*c->p == '0')
        c->p++;
    else if (!digits(c))
        return 0;
    if (c->p < c->end && *c->p == '.') {
        c->p++;
        if (!digits(c))
            return 0;
    }
    if (c->p < c->end && (*c->p == 'e' || *c->p == 'E')) {
        c->p++;
        if (c->p < c->end && (*c->p == '+' || *c->p == '-'))
            c->p++;
        if (!digits(c))
            return 0;
    }
    return 1;
}

static inline int literal(cursor *c, const char *word, Py_ssize_t n) {
    if (c->end - c->p < n || memcmp(c->p, word, (size_t)n) != 0)
        return 0;
    c->p += n;
    return 1;
}

static int check(const unsigned char *data, Py_ssize_t size) {
    cursor c = {data, data + size};
    unsigned char stack[MAX_DEPTH / 8];
    int depth = 0;
    /* a UTF-8 byte order mark may be ignored (RFC 8259 section 8.1) */
    if (size >= 3 && data[0] == 0xEF && data[1] == 0xBB && data[2] == 0xBF)
        c.p += 3;

value:
    skip_ws(&c);
    if (c.p >= c.end)
        return 0;
    switch (*c.p) {
    case '{':
        if (depth == MAX_DEPTH)
            return 0;
        stack[depth >> 3] |= (unsigned char)(1u << (depth & 7));
        depth++;
        c.p++;
        skip_ws(&c);
        if (c.p < c.end && *c.p == '}') {
            c.p++;
            depth--;
            goto after;
        }
        goto key;
    case '[':
        if (depth == MAX_DEPTH)
            return 0;
        stack[depth >> 3] &= (unsigned char)~(1u << (depth & 7));
        depth++;
        c.p++;
        skip_ws(&c);
        if (c.p < c.end && *c.p == ']') {
            c.p++;
            depth--;
            goto after;
        }
        goto value;
    case '"':
        c.p++;
        if (!string(&c))
            return 0;
        goto after;
    case 't':
        if (!literal(&c, "true", 4))
            return 0;
        goto after;
    case 'f':
        if (!literal(&c, "false", 5))
            return 0;
        goto after;
    case 'n':
        if (!literal(&c, "null", 4))
            return 0;
        goto after;
    default:
        if (*c.p == '-' || (*c.p >= '0' && *c.p <= '9')) {
            if (!number(&c))
                return 0;
            goto after;
        }
        return 0;
    }

key: /* inside an object, at a member's name (whitespace already skipped) */
    if (c.p >= c.end || *c.p != '"')
        return 0;
    c.p++;
    if (!string(&c))
        return 0;
    skip_ws(&c);
    if (c.p >= c.end || *c.p != ':')
        return 0;
    c.p++;
    goto value;

after: /* a value ended: a separator, a closing bracket, or the end of the text */
    skip_ws(&c);
    if (depth == 0)
        return c.p == c.end;
    if (c.p >= c.end)
        return 0;
    {
        int in_object = (stack[(depth - 1) >> 3] >> ((depth - 1) & 7)) & 1;
        unsigned char b = *c.p++;
        if (b == ',') {
            if (in_object) {
                skip_ws(&c);
                goto key;
            }
            goto value;
        }
        if (b == (in_object ? '}' : ']')) {
            depth--;
            goto after;
        }
        return 0;
    }
}

/* ---- The same check resumable across parts: a Checker is fed a text in parts of any size
 * (cut anywhere: inside a string, an escape, a number, a literal, a UTF-8 sequence, a byte
 * order mark) and says at finish() what valid() says of the whole. The grammar is the one of
 * check() above, written as states so that every place check() would meet the end of its
 * input is a place to stop and resume; the common cases (plain string runs, an escape or a
 * UTF-8 sequence with its bytes all in the part) take check()'s own fast paths. */

enum {
    M_START,    /* nothing yet: a byte order mark, or the value */
    M_BOM,      /* inside a byte order mark (aux: its bytes seen) */
    M_VALUE,    /* a value expected */
    M_OPEN_OBJ, /* just after '{': '}' or a member's name */
    M_OPEN_ARR, /* just after '[': ']' or a value */
    M_KEY,      /* a member's name expected */
    M_COLON,    /* after a member's name: ':' */
    M_AFTER,    /* a value ended: ',' or a closing bracket (at depth 0: whitespace only) */
    M_STR,      /* inside a string (key: it is a member's name) */
    M_ESC,      /* after a backslash */
    M_UHEX,     /* inside \uXXXX (aux: hex digits to go) */
    M_UTF8,     /* inside a UTF-8 sequence (aux: bytes to go; lo/hi: the next one's range) */
    M_NUM,      /* inside a number (aux: which part, N_*) */
    M_LIT,      /* inside true/false/null (lit, litlen; aux: bytes matched) */
    M_FAIL,     /* refused: stays so */
};

enum { N_MINUS, N_ZERO, N_INT, N_DOT, N_FRAC, N_E, N_ESIGN, N_EXP };

typedef struct {
    PyObject_HEAD
    int mode;
    int depth;
    int aux;
    int litlen;
    const char *lit;
    unsigned char lo, hi, key;
    unsigned char stack[MAX_DEPTH / 8];
} CheckerObject;

static inline int is_ws(unsigned char b) {
    return b == ' ' || b == '\n' || b == '\r' || b == '\t';
}

static inline int is_plain(unsigned char b) {
    return b >= 0x20 && b < 0x80 && b != '"' && b != '\\';
}

/* A UTF-8 lead byte (>= 0x80) starts a sequence: how many continuation bytes it needs and
 * the first one's range (check()'s utf8_seq, as ranges); 0 for a byte no sequence starts with. */
static inline int utf8_lead(unsigned char b0, unsigned char *lo, unsigned char *hi) {
    *lo = 0x80;
    *hi = 0xBF;
    if (b0 >= 0xC2 && b0 <= 0xDF)
        return 1;
    if (b0 >= 0xE0 && b0 <= 0xEF) {
        if (b0 == 0xE0)
            *lo = 0xA0; /* no overlong form */
        else if (b0 == 0xED)
            *hi = 0x9F; /* no U+D800..U+DFFF */
        return 2;
    }
    if (b0 >= 0xF0 && b0 <= 0xF4) {
        if (b0 == 0xF0)
            *lo = 0x90; /* no overlong form */
        else if (b0 == 0xF4)
            *hi = 0x8F; /* nothing above U+10FFFF */
        return 3;
    }
    return 0;
}

static void resume(CheckerObject *s, const unsigned char *p, const unsigned char *end) {
    int mode = s->mode;
    int depth = s->depth;
    int aux = s->aux; /* (locals: a store through s could alias the bytes read) */
    unsigned char key = s->key;
    unsigned char b;
    for (;;) {
        switch (mode) {
        case M_START:
            if (p == end)
                goto out;
            if (*p == 0xEF) {
                p++;
                aux = 1;
                mode = M_BOM;
            } else {
                mode = M_VALUE;
            }
            break;
        case M_BOM:
            if (p == end)
                goto out;
            if (*p != (aux == 1 ? 0xBB : 0xBF))
                goto fail;
            p++;
            if (++aux == 3)
                mode = M_VALUE;
            break;
        case M_VALUE:
            while (p < end && is_ws(*p))
                p++;
            if (p == end)
                goto out;
            b = *p++;
            switch (b) {
            case '{':
                if (depth == MAX_DEPTH)
                    goto fail;
                s->stack[depth >> 3] |= (unsigned char)(1u << (depth & 7));
                depth++;
                mode = M_OPEN_OBJ;
                break;
            case '[':
                if (depth == MAX_DEPTH)
                    goto fail;
                s->stack[depth >> 3] &= (unsigned char)~(1u << (depth & 7));
                depth++;
                mode = M_OPEN_ARR;
                break;
            case '"':
                key = 0;
                mode = M_STR;
                break;
            case 't':
                s->lit = "true";
                s->litlen = 4;
                aux = 1;
                mode = M_LIT;
                break;
            case 'f':
                s->lit = "false";
                s->litlen = 5;
                aux = 1;
                mode = M_LIT;
                break;
            case 'n':
                s->lit = "null";
                s->litlen = 4;
                aux = 1;
                mode = M_LIT;
                break;
            case '-':
                aux = N_MINUS;
                mode = M_NUM;
                break;
            case '0':
                aux = N_ZERO;
                mode = M_NUM;
                break;
            default:
                if (b < '1' || b > '9')
                    goto fail;
                aux = N_INT;
                mode = M_NUM;
            }
            break;
        case M_OPEN_OBJ:
        case M_OPEN_ARR:
            while (p < end && is_ws(*p))
                p++;
            if (p == end)
                goto out;
            if (*p == (mode == M_OPEN_OBJ ? '}' : ']')) {
                p++;
                depth--;
                mode = M_AFTER;
            } else {
                mode = mode == M_OPEN_OBJ ? M_KEY : M_VALUE;
            }
            break;
        case M_KEY:
            while (p < end && is_ws(*p))
                p++;
            if (p == end)
                goto out;
            if (*p++ != '"')
                goto fail;
            key = 1;
            mode = M_STR;
            break;
        case M_COLON:
            while (p < end && is_ws(*p))
                p++;
            if (p == end)
                goto out;
            if (*p++ != ':')
                goto fail;
            mode = M_VALUE;
            break;
        case M_AFTER:
            while (p < end && is_ws(*p))
                p++;
            if (p == end)
                goto out;
            if (depth == 0)
                goto fail; /* something after the text */
            {
                int in_object = (s->stack[(depth - 1) >> 3] >> ((depth - 1) & 7)) & 1;
                b = *p++;
                if (b == ',')
                    mode = in_object ? M_KEY : M_VALUE;
                else if (b == (in_object ? '}' : ']'))
                    depth--;
                else
                    goto fail;
            }
            break;
        case M_STR:
            for (;;) {
                p = plain_run(p, end);
                while (p < end && is_plain(*p))
                    p++;
                if (p == end)
                    goto out;
                b = *p;
                if (b == '"') {
                    p++;
                    mode = key ? M_COLON : M_AFTER;
                    break;
                }
                if (b == '\\') {
                    if (end - p >= 6) { /* all of it here: check()'s way */
                        unsigned char e = p[1];
                        if (e == 'u') {
                            if (!is_hex(p[2]) || !is_hex(p[3]) || !is_hex(p[4]) || !is_hex(p[5]))
                                goto fail;
                            p += 6;
                            continue;
                        }
                        if (e == '"' || e == '\\' || e == '/' || e == 'b' || e == 'f' ||
                            e == 'n' || e == 'r' || e == 't') {
                            p += 2;
                            continue;
                        }
                        goto fail;
                    }
                    p++;
                    mode = M_ESC;
                    break;
                }
                if (b < 0x20)
                    goto fail;
                if (end - p >= 4) { /* all of it here: check()'s way */
                    cursor c = {p, end};
                    if (!utf8_seq(&c))
                        goto fail;
                    p = c.p;
                    continue;
                }
                aux = utf8_lead(b, &s->lo, &s->hi);
                if (!aux)
                    goto fail;
                p++;
                mode = M_UTF8;
                break;
            }
            break;
        case M_ESC:
            if (p == end)
                goto out;
            b = *p++;
            if (b == 'u') {
                aux = 4;
                mode = M_UHEX;
            } else if (b == '"' || b == '\\' || b == '/' || b == 'b' || b == 'f' || b == 'n' ||
                       b == 'r' || b == 't') {
                mode = M_STR;
            } else {
                goto fail;
            }
            break;
        case M_UHEX:
            while (aux && p < end) {
                if (!is_hex(*p))
                    goto fail;
                p++;
                aux--;
            }
            if (aux)
                goto out;
            mode = M_STR;
            break;
        case M_UTF8:
            while (aux && p < end) {
                b = *p;
                if (b < s->lo || b > s->hi)
                    goto fail;
                p++;
                s->lo = 0x80;
                s->hi = 0xBF;
                aux--;
            }
            if (aux)
                goto out;
            mode = M_STR;
            break;
        case M_NUM:
            /* -?(0|[1-9][0-9]*)(\.[0-9]+)?([eE][+-]?[0-9]+)?, as number() */
            while (p < end) {
                b = *p;
                int digit = b >= '0' && b <= '9';
                switch (aux) {
                case N_MINUS:
                    if (!digit)
                        goto fail;
                    aux = b == '0' ? N_ZERO : N_INT;
                    p++;
                    continue;
                case N_INT:
                    if (digit) {
                        p++;
                        continue;
                    }
                    /* fall through: '.', an exponent, or the end */
                case N_ZERO:
                    if (b == '.') {
                        aux = N_DOT;
                        p++;
                        continue;
                    }
                    if (b == 'e' || b == 'E') {
                        aux = N_E;
                        p++;
                        continue;
                    }
                    goto number_end;
                case N_DOT:
                    if (!digit)
                        goto fail;
                    aux = N_FRAC;
                    p++;
                    continue;
                case N_FRAC:
                    if (digit) {
                        p++;
                        continue;
                    }
                    if (b == 'e' || b == 'E') {
                        aux = N_E;
                        p++;
                        continue;
                    }
                    goto number_end;
                case N_E:
                    if (b == '+' || b == '-') {
                        aux = N_ESIGN;
                        p++;
                        continue;
                    }
                    /* fall through: a digit */
                case N_ESIGN:
                    if (!digit)
                        goto fail;
                    aux = N_EXP;
                    p++;
                    continue;
                default: /* N_EXP */
                    if (digit) {
                        p++;
                        continue;
                    }
                    goto number_end;
                }
            }
            goto out;
        number_end: /* the byte that ended it is the next token's (not consumed) */
            mode = M_AFTER;
            break;
        case M_LIT:
            while (aux < s->litlen && p < end) {
                if (*p != (unsigned char)s->lit[aux])
                    goto fail;
                p++;
                aux++;
            }
            if (aux < s->litlen)
                goto out;
            mode = M_AFTER;
            break;
        default: /* M_FAIL */
            goto out;
        }
    }
fail:
    mode = M_FAIL;
out:
    s->mode = mode;
    s->depth = depth;
    s->aux = aux;
    s->key = key;
}

static int finish_state(CheckerObject *s) {
    int mode = s->mode;
    if (mode == M_NUM && (s->aux == N_ZERO || s->aux == N_INT || s->aux == N_FRAC ||
                          s->aux == N_EXP))
        mode = M_AFTER; /* a number ends where the text does */
    return mode == M_AFTER && s->depth == 0;
}

static int Checker_init(CheckerObject *self, PyObject *args, PyObject *kwds) {
    if (PyTuple_GET_SIZE(args) || (kwds != NULL && PyDict_GET_SIZE(kwds))) {
        PyErr_SetString(PyExc_TypeError, "Checker() takes no arguments");
        return -1;
    }
    self->mode = M_START;
    self->depth = 0;
    self->aux = 0;
    return 0;
}

/* feed(data[, start, stop]): the next part of the text (bytes start:stop of data); False once
 * the text so far can be no JSON text's beginning (then every later feed is a no-op). */
static PyObject *Checker_feed(CheckerObject *self, PyObject *const *args, Py_ssize_t nargs) {
    Py_buffer view;
    Py_ssize_t start = 0, stop;
    if (nargs != 1 && nargs != 3) {
        PyErr_SetString(PyExc_TypeError, "feed(data) or feed(data, start, stop)");
        return NULL;
    }
    if (PyObject_GetBuffer(args[0], &view, PyBUF_SIMPLE) < 0)
        return NULL;
    stop = view.len;
    if (nargs == 3) {
        start = PyLong_AsSsize_t(args[1]);
        if (start == -1 && PyErr_Occurred())
            goto error;
        stop = PyLong_AsSsize_t(args[2]);
        if (stop == -1 && PyErr_Occurred())
            goto error;
        if (start < 0 || stop < start || stop > view.len) {
            PyErr_SetString(PyExc_ValueError, "Checker.feed: start:stop outside the data");
            goto error;
        }
    }
    if (self->mode != M_FAIL) {
        const unsigned char *p = (const unsigned char *)view.buf;
        if (stop - start >= NOGIL_FROM) {
            Py_BEGIN_ALLOW_THREADS
            resume(self, p + start, p + stop);
            Py_END_ALLOW_THREADS
        } else {
            resume(self, p + start, p + stop);
        }
    }
    PyBuffer_Release(&view);
    return PyBool_FromLong(self->mode != M_FAIL);
error:
    PyBuffer_Release(&view);
    return NULL;
}

static PyObject *Checker_finish(CheckerObject *self, PyObject *Py_UNUSED(ignored)) {
    return PyBool_FromLong(finish_state(self));
}

static PyMethodDef Checker_methods[] = {
    {"feed", (PyCFunction)(void (*)(void))Checker_feed, METH_FASTCALL,
     "feed(data[, start, stop]) -> bool: the text's next part; False once it cannot be JSON."},
    {"finish", (PyCFunction)Checker_finish, METH_NOARGS,
     "finish() -> bool: whether the parts fed make one UTF-8 JSON text (as valid() of them)."},
    {NULL, NULL, 0, NULL},
};

static PyTypeObject CheckerType = {
    PyVarObject_HEAD_INIT(NULL, 0).tp_name = "vibemq_server.protocol._jsoncheck.Checker",
    .tp_basicsize = sizeof(CheckerObject),
    .tp_flags = Py_TPFLAGS_DEFAULT,
    .tp_doc = "A JSON check fed in parts (cut anywhere); finish() gives valid() of the whole.",
    .tp_methods = Checker_methods,
    .tp_new = PyType_GenericNew,
    .tp_init = (initproc)Checker_init,
};

static PyObject *jsoncheck_valid(PyObject *self, PyObject *arg) {
    Py_buffer view;
    int ok;
    (void)self;
    if (PyObject_GetBuffer(arg, &view, PyBUF_SIMPLE) < 0)
        return NULL;
    if (view.len >= NOGIL_FROM) {
        /* the buffer stays exported (and so unchanged) while we read it */
        Py_BEGIN_ALLOW_THREADS
        ok = check((const unsigned char *)view.buf, view.len);
        Py_END_ALLOW_THREADS
    } else {
        ok = check((const unsigned char *)view.buf, view.len);
    }
    PyBuffer_Release(&view);
    return PyBool_FromLong(ok);
}

static PyMethodDef methods[] = {
    {"valid", jsoncheck_valid, METH_O,
     "valid(data) -> bool: whether the bytes are one UTF-8 JSON text (RFC 8259)."},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {
    PyModuleDef_HEAD_INIT, "_jsoncheck", "A validating-only JSON checker.", -1, methods,
};

PyMODINIT_FUNC PyInit__jsoncheck(void) {
    PyObject *m;
#if PLAIN_SIMD
    __builtin_cpu_init();
    have_avx2 = __builtin_cpu_supports("avx2") ? 1 : 0;
    const char *no_avx512 = getenv("VIBEMQ_JSONCHECK_NO_AVX512");
    have_vbmi = __builtin_cpu_supports("avx512bw") && __builtin_cpu_supports("avx512vbmi") &&
                (no_avx512 == NULL || *no_avx512 == '\0');
#endif
    if (PyType_Ready(&CheckerType) < 0)
        return NULL;
    m = PyModule_Create(&module);
    if (m == NULL)
        return NULL;
    if (PyModule_AddObjectRef(m, "Checker", (PyObject *)&CheckerType) < 0) {
        Py_DECREF(m);
        return NULL;
    }
#if PLAIN_SIMD
    const char *simd = have_vbmi > 0 ? "avx512vbmi" : have_avx2 > 0 ? "avx2" : "sse2";
#else
    const char *simd = "swar";
#endif
    if (PyModule_AddStringConstant(m, "SIMD", simd) < 0 ||
        PyModule_AddIntConstant(m, "MAX_DEPTH", MAX_DEPTH) < 0 ||
        PyModule_AddIntConstant(m, "NOGIL_FROM", NOGIL_FROM) < 0) {
        Py_DECREF(m);
        return NULL;
    }
    return m;
}
