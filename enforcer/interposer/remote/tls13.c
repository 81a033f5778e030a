/* TLS 1.3 records with AES-128-GCM (tls13.h). The client library is loaded
 * into programs that may bring a crypto library of their own, so the
 * cipher is here, on AES-NI and PCLMULQDQ, and nothing of it is exported.
 *
 * GCM's GHASH works on byte-reversed blocks (the bit order PCLMULQDQ
 * multiplies in, shifted by one) and folds eight blocks per reduction with
 * H^1..H^8; the counter blocks are encrypted eight at a time. Those are
 * what make a core reach GB/s. Where the CPU has VAES and VPCLMULQDQ on
 * 512-bit registers, bulk data goes sixteen blocks at a time, four to a
 * register, folded with H^1..H^16: about twice the rate, which on a small
 * machine is CPU the network stack gets back.
 *
 * Where the kernel carries TLS (ktls.h), the record layer hands it each
 * direction it takes, and is left with what is not application data. */
#define _GNU_SOURCE
#include <cpuid.h>
#include <errno.h>
#include <immintrin.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>

#include "ktls.h"
#include "proto.h"
#include "tls13.h"

#define TARGET __attribute__((target("aes,pclmul,sse4.1,ssse3")))
#define TARGET_WIDE __attribute__((target("aes,pclmul,sse4.1,ssse3,avx2,avx512f,avx512bw,vaes,vpclmulqdq")))

enum { CT_ALERT = 21, CT_HANDSHAKE = 22, CT_DATA = 23 };
enum { HS_KEY_UPDATE = 24, ALERT_CLOSE_NOTIFY = 0 };

/* Records per write key: far inside AES-GCM's limit (RFC 8446 5.5). */
#define KEY_UPDATE_EVERY (1ull << 23)

/* Records sealed before one send, and received by one read at most: a
 * MiB of bulk data costs 8 system calls each way rather than 64. */
#define BATCH 8

/* With the kernel's records: a read smaller than this goes through rbuf,
 * so that a KeyUpdate or an alert is taken whole; the sending sequence
 * number is read back from the kernel every SEQ_CHECK_WRITES writes or
 * SEQ_CHECK_BYTES bytes (each far inside KEY_UPDATE_EVERY's margin). */
#define KERNEL_SMALL_READ 64
#define SEQ_CHECK_WRITES 4096
#define SEQ_CHECK_BYTES (1ull << 30)

struct gcm {
    __m128i rk[11]; /* AES-128 round keys */
    __m128i h[8];   /* H^1..H^8, byte-reversed */
    __m128i hr[16]; /* H^16..H^1: four to a 512-bit register, block j's power first */
    uint8_t iv[12];
};

struct half {
    struct gcm c;
    uint8_t secret[32];
    uint64_t seq;
};

struct gwr_tls {
    struct half w, r;
    int fd;
    pthread_mutex_t wmu; /* one batch of records at a time goes out: w, wbuf, wlen, werr */
    int werr, rerr;      /* sticky errno of each side */
    int closed;          /* close_notify sent: nothing more goes out, a KeyUpdate answer neither */
    int eof;
    int ktx, krx;        /* the kernel seals what is sent, opens what is received (ktls.h) */
    const char *kwhat;   /* what the kernel refused, with kerr: why not ktx and krx */
    int kerr;
    uint64_t kwrites, kbytes; /* since the sending sequence number was read back */
    size_t rpos, rend;    /* rbuf[rpos, rend): received, not yet taken */
    size_t plain, nplain; /* the current record's content not yet read: rbuf[plain, plain + nplain) */
    size_t wlen;          /* sealed records in wbuf, not yet sent */
    uint8_t wbuf[BATCH * GWR_TLS_MAX_RECORD], rbuf[BATCH * GWR_TLS_MAX_RECORD];
};

/* HMAC-SHA256 of a short message (n <= 64) under a 32-byte key. */
static void hmac(const uint8_t key[32], const uint8_t *msg, size_t n, uint8_t out[32]) {
    uint8_t b[64 + 64];
    memset(b, 0x36, 64);
    for (int i = 0; i < 32; i++) b[i] ^= key[i];
    memcpy(b + 64, msg, n);
    uint8_t inner[GWR_HASH_SIZE];
    gwr_sha256(b, 64 + n, inner);
    for (int i = 0; i < 64; i++) b[i] ^= 0x36 ^ 0x5c;
    memcpy(b + 64, inner, sizeof inner);
    gwr_sha256(b, 64 + sizeof inner, out);
    explicit_bzero(b, sizeof b);
}

/* HKDF-Expand-Label(secret, label, "", n) for n <= 32 (RFC 8446 7.1): a
 * single HMAC block. */
static void expand_label(const uint8_t secret[32], const char *label, uint8_t *out, size_t n) {
    uint8_t info[32], t[32];
    size_t ll = strlen(label), at = 0;
    info[at++] = 0;
    info[at++] = (uint8_t)n;
    info[at++] = (uint8_t)(6 + ll);
    memcpy(info + at, "tls13 ", 6);
    memcpy(info + at + 6, label, ll);
    at += 6 + ll;
    info[at++] = 0; /* no context */
    info[at++] = 1; /* T(1) */
    hmac(secret, info, at, t);
    memcpy(out, t, n);
    explicit_bzero(t, sizeof t);
}

static TARGET __m128i bswap(__m128i x) {
    return _mm_shuffle_epi8(x, _mm_set_epi8(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15));
}

static TARGET __m128i key_step(__m128i k, __m128i assist) {
    k = _mm_xor_si128(k, _mm_slli_si128(k, 4));
    k = _mm_xor_si128(k, _mm_slli_si128(k, 4));
    k = _mm_xor_si128(k, _mm_slli_si128(k, 4));
    return _mm_xor_si128(k, _mm_shuffle_epi32(assist, 0xff));
}

static TARGET __m128i aes(const __m128i rk[11], __m128i b) {
    b = _mm_xor_si128(b, rk[0]);
    for (int i = 1; i < 10; i++) b = _mm_aesenc_si128(b, rk[i]);
    return _mm_aesenclast_si128(b, rk[10]);
}

/* Accumulates a * b unreduced: the 256-bit product is lo + mid * 2^64 + hi * 2^128. */
static TARGET void mul_add(__m128i a, __m128i b, __m128i *lo, __m128i *mid, __m128i *hi) {
    *lo = _mm_xor_si128(*lo, _mm_clmulepi64_si128(a, b, 0x00));
    *hi = _mm_xor_si128(*hi, _mm_clmulepi64_si128(a, b, 0x11));
    *mid = _mm_xor_si128(*mid, _mm_xor_si128(_mm_clmulepi64_si128(a, b, 0x01), _mm_clmulepi64_si128(a, b, 0x10)));
}

/* Reduces a product modulo x^128 + x^7 + x^2 + x + 1 (Intel's "Carry-Less
 * Multiplication and its Usage for Computing the GCM Mode", algorithm 5).
 * The shift by one bit corrects for the reflected bit order. */
static TARGET __m128i reduce(__m128i lo, __m128i mid, __m128i hi) {
    __m128i a = _mm_xor_si128(lo, _mm_slli_si128(mid, 8));
    __m128i b = _mm_xor_si128(hi, _mm_srli_si128(mid, 8));
    __m128i ca = _mm_srli_epi32(a, 31), cb = _mm_srli_epi32(b, 31);
    a = _mm_or_si128(_mm_slli_epi32(a, 1), _mm_slli_si128(ca, 4));
    b = _mm_or_si128(_mm_or_si128(_mm_slli_epi32(b, 1), _mm_slli_si128(cb, 4)), _mm_srli_si128(ca, 12));
    __m128i t = _mm_xor_si128(_mm_xor_si128(_mm_slli_epi32(a, 31), _mm_slli_epi32(a, 30)), _mm_slli_epi32(a, 25));
    __m128i u = _mm_srli_si128(t, 4);
    a = _mm_xor_si128(a, _mm_slli_si128(t, 12));
    __m128i v = _mm_xor_si128(_mm_xor_si128(_mm_srli_epi32(a, 1), _mm_srli_epi32(a, 2)), _mm_srli_epi32(a, 7));
    return _mm_xor_si128(b, _mm_xor_si128(a, _mm_xor_si128(v, u)));
}

static TARGET __m128i gf_mul(__m128i a, __m128i b) {
    __m128i lo = _mm_setzero_si128(), mid = lo, hi = lo;
    mul_add(a, b, &lo, &mid, &hi);
    return reduce(lo, mid, hi);
}

static TARGET void gcm_init(struct gcm *g, const uint8_t key[16], const uint8_t iv[12]) {
    __m128i *rk = g->rk;
    rk[0] = _mm_loadu_si128((const __m128i *)key);
#define STEP(i, rcon) rk[i] = key_step(rk[i - 1], _mm_aeskeygenassist_si128(rk[i - 1], rcon))
    STEP(1, 0x01), STEP(2, 0x02), STEP(3, 0x04), STEP(4, 0x08), STEP(5, 0x10);
    STEP(6, 0x20), STEP(7, 0x40), STEP(8, 0x80), STEP(9, 0x1b), STEP(10, 0x36);
#undef STEP
    g->h[0] = bswap(aes(rk, _mm_setzero_si128()));
    for (int i = 1; i < 8; i++) g->h[i] = gf_mul(g->h[i - 1], g->h[0]);
    g->hr[15] = g->h[0];
    for (int i = 14; i >= 0; i--) g->hr[i] = gf_mul(g->hr[i + 1], g->h[0]);
    memcpy(g->iv, iv, sizeof g->iv);
}

static int g_narrow; /* gwr_tls_wide(0) was called */
static int g_wide;   /* VAES and VPCLMULQDQ on 512-bit registers, and not g_narrow (gwr_tls_supported) */

static TARGET_WIDE __m128i fold_lanes(__m512i z) {
    __m256i t = _mm256_xor_si256(_mm512_castsi512_si256(z), _mm512_extracti64x4_epi64(z, 1));
    return _mm_xor_si128(_mm256_castsi256_si128(t), _mm256_extracti128_si256(t, 1));
}

/* gcm_wide runs gcm()'s bulk loop 256 bytes at a time over as much of
 * p[0, n) as it can and returns how much; *ctr (the last counter used)
 * and *x (the hash so far) go on from there. */
static TARGET_WIDE size_t gcm_wide(const struct gcm *g, __m128i *ctr, __m128i *x, uint8_t *p, size_t n,
                                   int sealing) {
    const __m512i rev = _mm512_broadcast_i32x4(_mm_set_epi8(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15));
    const __m512i step = _mm512_set_epi32(0, 0, 0, 4, 0, 0, 0, 3, 0, 0, 0, 2, 0, 0, 0, 1);
    const __m512i four = _mm512_set_epi32(0, 0, 0, 4, 0, 0, 0, 4, 0, 0, 0, 4, 0, 0, 0, 4);
    __m512i rk[11], hz[4], base = _mm512_broadcast_i32x4(*ctr);
    for (int i = 0; i < 11; i++) rk[i] = _mm512_broadcast_i32x4(g->rk[i]);
    for (int k = 0; k < 4; k++) hz[k] = _mm512_loadu_si512((const void *)&g->hr[4 * k]);
    size_t at = 0;
    for (; n - at >= 256; at += 256) {
        __m512i b[4], c[4], cv = _mm512_add_epi32(base, step);
#pragma GCC unroll 4
        for (int j = 0; j < 4; j++) {
            b[j] = _mm512_xor_si512(_mm512_shuffle_epi8(cv, rev), rk[0]);
            cv = _mm512_add_epi32(cv, four);
            c[j] = _mm512_loadu_si512((const void *)(p + at + 64 * j));
        }
        base = _mm512_add_epi32(base, _mm512_slli_epi32(four, 2));
#pragma GCC unroll 9
        for (int i = 1; i < 10; i++)
#pragma GCC unroll 4
            for (int j = 0; j < 4; j++) b[j] = _mm512_aesenc_epi128(b[j], rk[i]);
        __m512i lo = _mm512_setzero_si512(), mid = lo, hi = lo;
#pragma GCC unroll 4
        for (int j = 0; j < 4; j++) {
            b[j] = _mm512_xor_si512(_mm512_aesenclast_epi128(b[j], rk[10]), c[j]);
            _mm512_storeu_si512((void *)(p + at + 64 * j), b[j]);
            __m512i d = _mm512_shuffle_epi8(sealing ? b[j] : c[j], rev);
            if (j == 0) d = _mm512_xor_si512(d, _mm512_zextsi128_si512(*x));
            lo = _mm512_xor_si512(lo, _mm512_clmulepi64_epi128(d, hz[j], 0x00));
            hi = _mm512_xor_si512(hi, _mm512_clmulepi64_epi128(d, hz[j], 0x11));
            mid = _mm512_xor_si512(mid, _mm512_xor_si512(_mm512_clmulepi64_epi128(d, hz[j], 0x01),
                                                         _mm512_clmulepi64_epi128(d, hz[j], 0x10)));
        }
        *x = reduce(fold_lanes(lo), fold_lanes(mid), fold_lanes(hi));
    }
    *ctr = _mm512_castsi512_si128(base);
    return at;
}

/* GCM over p[0, n) in place (RFC 5116's AEAD_AES_128_GCM with a 12-byte
 * nonce): encrypts if sealing, else decrypts; either way tag gets the tag
 * of the ciphertext and aad. */
static TARGET void gcm(const struct gcm *g, const uint8_t nonce[12], const uint8_t *aad, size_t naad, uint8_t *p,
                       size_t n, int sealing, uint8_t tag[16]) {
    const __m128i *rk = g->rk, one = _mm_set_epi32(0, 0, 0, 1);
    uint8_t blk[16] = {0};
    memcpy(blk, nonce, 12);
    blk[15] = 1;
    __m128i ctr = bswap(_mm_loadu_si128((const __m128i *)blk)); /* the counter in lane 0 */
    __m128i mask = aes(rk, bswap(ctr));
    memset(blk, 0, sizeof blk);
    memcpy(blk, aad, naad);
    __m128i x = gf_mul(bswap(_mm_loadu_si128((const __m128i *)blk)), g->h[0]);
    size_t at = g_wide ? gcm_wide(g, &ctr, &x, p, n, sealing) : 0;
    for (; n - at >= 128; at += 128) {
        __m128i b[8], c[8], lo = _mm_setzero_si128(), mid = lo, hi = lo;
#pragma GCC unroll 8
        for (int j = 0; j < 8; j++) {
            ctr = _mm_add_epi32(ctr, one);
            b[j] = _mm_xor_si128(bswap(ctr), rk[0]);
            c[j] = _mm_loadu_si128((const __m128i *)(p + at + 16 * j));
        }
#pragma GCC unroll 9
        for (int i = 1; i < 10; i++)
#pragma GCC unroll 8
            for (int j = 0; j < 8; j++) b[j] = _mm_aesenc_si128(b[j], rk[i]);
#pragma GCC unroll 8
        for (int j = 0; j < 8; j++) {
            b[j] = _mm_xor_si128(_mm_aesenclast_si128(b[j], rk[10]), c[j]);
            _mm_storeu_si128((__m128i *)(p + at + 16 * j), b[j]);
            if (sealing) c[j] = b[j];
        }
        x = _mm_xor_si128(x, bswap(c[0]));
        mul_add(x, g->h[7], &lo, &mid, &hi);
#pragma GCC unroll 7
        for (int j = 1; j < 8; j++) mul_add(bswap(c[j]), g->h[7 - j], &lo, &mid, &hi);
        x = reduce(lo, mid, hi);
    }
    for (; at < n; at += 16) {
        size_t k = n - at < 16 ? n - at : 16;
        memset(blk, 0, sizeof blk);
        memcpy(blk, p + at, k);
        __m128i c = _mm_loadu_si128((const __m128i *)blk);
        ctr = _mm_add_epi32(ctr, one);
        __m128i b = _mm_xor_si128(aes(rk, bswap(ctr)), c);
        _mm_storeu_si128((__m128i *)blk, b);
        memcpy(p + at, blk, k);
        if (sealing) { /* the ciphertext's padding is zeros, not keystream */
            memset(blk + k, 0, 16 - k);
            c = _mm_loadu_si128((const __m128i *)blk);
        }
        x = gf_mul(_mm_xor_si128(x, bswap(c)), g->h[0]);
    }
    __m128i lens = _mm_set_epi64x((long long)naad * 8, (long long)n * 8);
    x = gf_mul(_mm_xor_si128(x, lens), g->h[0]);
    _mm_storeu_si128((__m128i *)tag, _mm_xor_si128(bswap(x), mask));
}

static void set_keys(struct half *h) {
    uint8_t key[16], iv[12];
    expand_label(h->secret, "key", key, sizeof key);
    expand_label(h->secret, "iv", iv, sizeof iv);
    gcm_init(&h->c, key, iv);
    explicit_bzero(key, sizeof key);
}

/* next_secret moves h on to its next traffic secret (RFC 8446 7.2). */
static void next_secret(struct half *h) {
    expand_label(h->secret, "traffic upd", h->secret, sizeof h->secret);
    set_keys(h);
    h->seq = 0;
}

/* kernel_key gives the kernel h's key for the direction (ktls.h). */
static int kernel_key(const struct gwr_tls *t, const struct half *h, int tx) {
    uint8_t key[16], iv[12];
    expand_label(h->secret, "key", key, sizeof key);
    expand_label(h->secret, "iv", iv, sizeof iv);
    int rc = gwr_ktls_set_key(t->fd, tx, key, iv, h->seq);
    explicit_bzero(key, sizeof key);
    explicit_bzero(iv, sizeof iv);
    return rc;
}

static void nonce(const struct half *h, uint8_t out[12]) {
    memcpy(out, h->c.iv, 12);
    for (int i = 0; i < 8; i++) out[11 - i] ^= (uint8_t)(h->seq >> (8 * i));
}

/* body_len is the length after the header of a record that may come here; -1 if none may. */
static ssize_t body_len(const uint8_t *rec) {
    size_t n = (size_t)rec[3] << 8 | rec[4];
    if (rec[0] != CT_DATA || rec[1] != 3 || rec[2] != 3 || n < 1 + GWR_TLS_TAG || n > GWR_TLS_MAX_RECORD - GWR_TLS_HDR)
        return -1;
    return (ssize_t)n;
}

size_t gwr_tls_seal(struct gwr_tls *t, uint8_t *rec, size_t inner) {
    size_t n = inner + GWR_TLS_TAG;
    rec[0] = CT_DATA, rec[1] = 3, rec[2] = 3, rec[3] = (uint8_t)(n >> 8), rec[4] = (uint8_t)n;
    uint8_t iv[12];
    nonce(&t->w, iv);
    gcm(&t->w.c, iv, rec, GWR_TLS_HDR, rec + GWR_TLS_HDR, inner, 1, rec + GWR_TLS_HDR + inner);
    t->w.seq++;
    return GWR_TLS_HDR + n;
}

ssize_t gwr_tls_open(struct gwr_tls *t, uint8_t *rec, uint8_t *type) {
    ssize_t len = body_len(rec);
    if (len < 0) {
        errno = EPROTO;
        return -1;
    }
    size_t n = (size_t)len - GWR_TLS_TAG;
    uint8_t iv[12], tag[16], diff = 0;
    nonce(&t->r, iv);
    gcm(&t->r.c, iv, rec, GWR_TLS_HDR, rec + GWR_TLS_HDR, n, 0, tag);
    for (int i = 0; i < 16; i++) diff |= tag[i] ^ rec[GWR_TLS_HDR + n + i]; /* in constant time */
    if (diff) {
        errno = EBADMSG;
        return -1;
    }
    t->r.seq++;
    while (n && !rec[GWR_TLS_HDR + n - 1]) n--; /* the padding */
    if (!n) {
        errno = EPROTO;
        return -1;
    }
    *type = rec[GWR_TLS_HDR + n - 1];
    return (ssize_t)n - 1;
}

int gwr_tls_supported(void) {
    __builtin_cpu_init();
    int ok = __builtin_cpu_supports("aes") && __builtin_cpu_supports("pclmul") && __builtin_cpu_supports("sse4.1") &&
             __builtin_cpu_supports("ssse3");
    /* avx512f and avx512bw are also the OS's word that it saves 512-bit
     * registers; VAES and VPCLMULQDQ are CPUID leaf 7's ECX bits 9 and 10. */
    unsigned a, b, c, d;
    g_wide = ok && !g_narrow && __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
             __get_cpuid_count(7, 0, &a, &b, &c, &d) && (c & (1u << 9)) && (c & (1u << 10));
    return ok;
}

static int g_user_only; /* gwr_tls_kernel(0) was called */

void gwr_tls_kernel(int on) { g_user_only = !on; }

/* kernel_install hands the kernel what it takes of t, sending side first;
 * the rest stays here, and kwhat and kerr say why. */
static void kernel_install(struct gwr_tls *t) {
    if (g_user_only) {
        t->kwhat = "switched off", t->kerr = 0;
        return;
    }
    if (gwr_ktls_attach(t->fd)) {
        t->kwhat = errno == ENOTSUP ? "needs Linux 6.14 or later, for key updates" : "attaching the tls protocol";
        t->kerr = errno == ENOTSUP ? 0 : errno;
        return;
    }
    t->ktx = !kernel_key(t, &t->w, 1);
    if (!t->ktx) {
        t->kwhat = "installing the sending key", t->kerr = errno;
        return;
    }
    t->krx = !kernel_key(t, &t->r, 0);
    if (!t->krx) t->kwhat = "installing the receiving key", t->kerr = errno;
}

int gwr_tls_in_kernel(const struct gwr_tls *t, char *why, size_t n) {
    if (why && n) {
        const char *where = t->ktx ? "received records in user space" : "records in user space";
        if (t->ktx && t->krx) snprintf(why, n, "records in the kernel");
        else if (t->kerr) snprintf(why, n, "%s (kernel TLS: %s: %s)", where, t->kwhat, strerror(t->kerr));
        else snprintf(why, n, "%s (kernel TLS: %s)", where, t->kwhat);
    }
    return t->ktx | t->krx << 1;
}

int gwr_tls_wide(int on) {
    g_narrow = !on;
    gwr_tls_supported();
    return g_wide;
}

struct gwr_tls *gwr_tls_new(int fd, const struct gwr_tls_state *st) {
    if (fd < 0 || !st) {
        errno = EINVAL;
        return NULL;
    }
    if (st->suite != GWR_TLS_AES_128_GCM_SHA256 || !gwr_tls_supported()) {
        errno = ENOTSUP;
        return NULL;
    }
    struct gwr_tls *t = calloc(1, sizeof *t);
    if (!t) return NULL;
    t->fd = fd;
    pthread_mutex_init(&t->wmu, NULL);
    memcpy(t->w.secret, st->write_secret, sizeof t->w.secret);
    memcpy(t->r.secret, st->read_secret, sizeof t->r.secret);
    t->w.seq = st->write_seq;
    t->r.seq = st->read_seq;
    set_keys(&t->w);
    set_keys(&t->r);
    kernel_install(t);
    return t;
}

void gwr_tls_free(struct gwr_tls *t) {
    if (!t) return;
    pthread_mutex_destroy(&t->wmu);
    explicit_bzero(t, sizeof *t);
    free(t);
}

/* The next record's inner plaintext goes here; with wmu held. */
static uint8_t *next_inner(struct gwr_tls *t) { return t->wbuf + t->wlen + GWR_TLS_HDR; }

/* seal seals the next record (its inner plaintext of n bytes at
 * next_inner) into the batch; with wmu held. */
static void seal(struct gwr_tls *t, size_t n) { t->wlen += gwr_tls_seal(t, t->wbuf + t->wlen, n); }

/* drain sends the batch; with wmu held. */
static int drain(struct gwr_tls *t) {
    if (t->werr) {
        errno = t->werr;
        return -1;
    }
    const uint8_t *p = t->wbuf;
    size_t left = t->wlen;
    t->wlen = 0;
    while (left) {
        ssize_t k = send(t->fd, p, left, MSG_NOSIGNAL);
        if (k < 0 && errno == EINTR) continue;
        if (k < 0) {
            t->werr = errno;
            return -1;
        }
        p += k;
        left -= (size_t)k;
    }
    return 0;
}

/* put seals one record of n inner bytes and sends it; with wmu held and
 * the batch empty. */
static int put(struct gwr_tls *t, size_t n) {
    if (t->werr) {
        errno = t->werr;
        return -1;
    }
    seal(t, n);
    return drain(t);
}

/* kernel_put sends one record of another content type through the
 * kernel; with wmu held. */
static int kernel_put(struct gwr_tls *t, uint8_t type, const uint8_t *m, size_t n) {
    if (t->werr) {
        errno = t->werr;
        return -1;
    }
    struct iovec v = {(void *)m, n};
    if (gwr_ktls_send(t->fd, type, &v, 1)) {
        t->werr = errno;
        return -1;
    }
    return 0;
}

/* key_update sends a KeyUpdate and then writes with the next secret; with wmu held. */
static int key_update(struct gwr_tls *t, int request_peer) {
    if (t->ktx) {
        const uint8_t m[5] = {HS_KEY_UPDATE, 0, 0, 1, request_peer ? 1 : 0};
        if (kernel_put(t, CT_HANDSHAKE, m, sizeof m)) return -1;
        next_secret(&t->w);
        if (kernel_key(t, &t->w, 1)) {
            t->werr = errno;
            return -1;
        }
        t->kwrites = t->kbytes = 0;
        return 0;
    }
    uint8_t *m = next_inner(t);
    m[0] = HS_KEY_UPDATE, m[1] = 0, m[2] = 0, m[3] = 1, m[4] = request_peer ? 1 : 0, m[5] = CT_HANDSHAKE;
    if (put(t, 6)) return -1;
    next_secret(&t->w);
    return 0;
}

int gwr_tls_update(struct gwr_tls *t, int request_peer) {
    pthread_mutex_lock(&t->wmu);
    int rc = key_update(t, request_peer);
    pthread_mutex_unlock(&t->wmu);
    return rc;
}

int gwr_tls_close(struct gwr_tls *t) {
    pthread_mutex_lock(&t->wmu);
    const uint8_t alert[2] = {1 /* warning */, ALERT_CLOSE_NOTIFY};
    int rc;
    if (t->ktx) {
        rc = kernel_put(t, CT_ALERT, alert, sizeof alert);
    } else {
        uint8_t *m = next_inner(t);
        m[0] = alert[0], m[1] = alert[1], m[2] = CT_ALERT;
        rc = put(t, 3);
    }
    if (!rc) t->werr = EPIPE, t->closed = 1;
    pthread_mutex_unlock(&t->wmu);
    return rc;
}

/* kernel_batch sends up to a batch's worth of v from v[*i] + *off through
 * the kernel, and moves *i and *off past it; with wmu held. Before, it
 * reads the kernel's sequence number back when due, and updates the key
 * when that is at the limit. */
static int kernel_batch(struct gwr_tls *t, const struct iovec *v, int n, int *i, size_t *off) {
    if (t->werr) {
        errno = t->werr;
        return -1;
    }
    if (t->kwrites >= SEQ_CHECK_WRITES || t->kbytes >= SEQ_CHECK_BYTES) {
        if (gwr_ktls_tx_seq(t->fd, &t->w.seq)) {
            t->werr = errno;
            return -1;
        }
        t->kwrites = t->kbytes = 0;
    }
    if (t->w.seq >= KEY_UPDATE_EVERY && key_update(t, 0)) return -1;
    struct iovec part[BATCH];
    int k = 0;
    size_t len = 0;
    while (*i < n && k < BATCH && len < BATCH * GWR_TLS_MAX_PLAIN) {
        size_t take = v[*i].iov_len - *off;
        if (take > BATCH * GWR_TLS_MAX_PLAIN - len) take = BATCH * GWR_TLS_MAX_PLAIN - len;
        part[k++] = (struct iovec){(uint8_t *)v[*i].iov_base + *off, take};
        len += take;
        *off += take;
        if (*off == v[*i].iov_len) ++*i, *off = 0;
    }
    if (gwr_ktls_send(t->fd, CT_DATA, part, k)) {
        t->werr = errno;
        return -1;
    }
    t->kwrites++;
    t->kbytes += len;
    return 0;
}

int gwr_tls_writev(struct gwr_tls *t, const struct iovec *v, int n) {
    int i = 0;
    size_t off = 0;
    for (;;) {
        while (i < n && off == v[i].iov_len) i++, off = 0;
        if (i == n) return 0;
        /* A batch at a time: a KeyUpdate answer waits for one batch, not a whole write. */
        pthread_mutex_lock(&t->wmu);
        if (t->ktx) {
            int rc = kernel_batch(t, v, n, &i, &off);
            pthread_mutex_unlock(&t->wmu);
            if (rc) return -1;
            continue;
        }
        int rc = t->w.seq >= KEY_UPDATE_EVERY ? key_update(t, 0) : 0;
        for (int r = 0; !rc && i < n && r < BATCH; r++) {
            uint8_t *m = next_inner(t);
            size_t len = 0;
            while (i < n && len < GWR_TLS_MAX_PLAIN) {
                size_t k = v[i].iov_len - off;
                if (k > GWR_TLS_MAX_PLAIN - len) k = GWR_TLS_MAX_PLAIN - len;
                memcpy(m + len, (const uint8_t *)v[i].iov_base + off, k);
                len += k;
                off += k;
                if (off == v[i].iov_len) i++, off = 0;
            }
            m[len] = CT_DATA;
            seal(t, len + 1);
        }
        if (!rc) rc = drain(t);
        pthread_mutex_unlock(&t->wmu);
        if (rc) return -1;
    }
}

/* fill makes rbuf hold at least want bytes from rpos on: 1, 0 at EOF
 * with nothing held, or -1. A read takes what fits: during a bulk copy,
 * several records. What is moved down to make room is less than a
 * record. */
static int fill(struct gwr_tls *t, size_t want) {
    if (t->rpos + want > sizeof t->rbuf) {
        memmove(t->rbuf, t->rbuf + t->rpos, t->rend - t->rpos);
        t->rend -= t->rpos;
        t->rpos = 0;
    }
    while (t->rend - t->rpos < want) {
        ssize_t k = recv(t->fd, t->rbuf + t->rend, sizeof t->rbuf - t->rend, 0);
        if (k < 0 && errno == EINTR) continue;
        if (k < 0) return -1;
        if (k == 0) {
            if (t->rend == t->rpos) return 0;
            errno = EPROTO; /* the stream ended inside a record */
            return -1;
        }
        t->rend += (size_t)k;
    }
    return 1;
}

/* control acts on a record that is not application data, its content m[0,
 * n): 1 (taken), 0 (close_notify) or -1. */
static int control(struct gwr_tls *t, uint8_t type, const uint8_t *m, size_t n) {
    if (type == CT_ALERT && n == 2) {
        if (m[1] == ALERT_CLOSE_NOTIFY) return 0;
        errno = ECONNRESET;
        return -1;
    }
    /* A KeyUpdate comes in a record of its own (RFC 8446 5.1); the agents
     * let no other handshake message follow the handover. */
    if (type == CT_HANDSHAKE && n == 5 && m[0] == HS_KEY_UPDATE && m[1] == 0 && m[2] == 0 && m[3] == 1 && m[4] <= 1) {
        next_secret(&t->r);
        if (t->krx && kernel_key(t, &t->r, 0)) return -1;
        if (!m[4]) return 1;
        pthread_mutex_lock(&t->wmu);
        int rc = t->closed ? 0 : key_update(t, 0);
        pthread_mutex_unlock(&t->wmu);
        return rc ? -1 : 1;
    }
    errno = EPROTO;
    return -1;
}

/* next_record takes in the next record: 1, 0 at the end of the stream, or -1. */
static int next_record(struct gwr_tls *t) {
    int r = fill(t, GWR_TLS_HDR);
    if (r <= 0) return r;
    ssize_t len = body_len(t->rbuf + t->rpos);
    if (len < 0) {
        errno = EPROTO;
        return -1;
    }
    if (fill(t, GWR_TLS_HDR + (size_t)len) <= 0) {
        errno = EPROTO;
        return -1;
    }
    uint8_t *rec = t->rbuf + t->rpos, type, *m = rec + GWR_TLS_HDR;
    ssize_t n = gwr_tls_open(t, rec, &type);
    if (n < 0) return -1;
    t->rpos += GWR_TLS_HDR + (size_t)len;
    if (type == CT_DATA) {
        t->plain = (size_t)(m - t->rbuf);
        t->nplain = (size_t)n;
        return 1;
    }
    return control(t, type, m, (size_t)n);
}

/* kernel_record reads what the kernel opened: application data straight
 * into buf, or through rbuf for a small read (*direct: the bytes read into
 * buf); another content type goes to control. 1, 0 at the end of the
 * stream, or -1. */
static int kernel_record(struct gwr_tls *t, void *buf, size_t n, ssize_t *direct) {
    int small = n < KERNEL_SMALL_READ;
    uint8_t *dst = small ? t->rbuf : buf, type;
    ssize_t k;
    do k = gwr_ktls_recv(t->fd, dst, small ? sizeof t->rbuf : n, &type);
    while (k < 0 && errno == EINTR);
    if (k <= 0) return (int)k;
    if (type != CT_DATA) return control(t, type, dst, (size_t)k);
    if (small) t->plain = 0, t->nplain = (size_t)k;
    else *direct = k;
    return 1;
}

int gwr_tls_pending(const struct gwr_tls *t) {
    size_t have = t->rend - t->rpos;
    if (t->nplain || t->rerr || t->eof) return 1;
    if (have < GWR_TLS_HDR) return 0;
    ssize_t len = body_len(t->rbuf + t->rpos);
    return len < 0 || have >= GWR_TLS_HDR + (size_t)len; /* a bad header fails at once too */
}

ssize_t gwr_tls_read(struct gwr_tls *t, void *buf, size_t n) {
    if (t->rerr) {
        errno = t->rerr;
        return -1;
    }
    while (!t->nplain && !t->eof && n) {
        ssize_t direct = 0;
        int r = t->krx ? kernel_record(t, buf, n, &direct) : next_record(t);
        if (r < 0) {
            t->rerr = errno;
            return -1;
        }
        if (direct) return direct;
        t->eof = !r;
    }
    if (n > t->nplain) n = t->nplain;
    memcpy(buf, t->rbuf + t->plain, n);
    t->plain += n;
    t->nplain -= n;
    return (ssize_t)n;
}
