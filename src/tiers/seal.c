/*
 * Sealing with XAES-256-GCM (seal.h: where the seal lives, what it binds).
 *
 * Why XAES-256-GCM and not AES-256-GCM with a random 96-bit nonce: a fleet
 * seals every chunk every engine stores under one secret.  Random 96-bit
 * nonces are safe for about 2^32 values per key (NIST SP 800-38D), which a
 * fleet of a hundred engines storing a thousand chunks a second each
 * reaches in half a day; a repeated nonce under GCM gives away the
 * authentication key.  XAES-256-GCM (C2SP, "XAES-256-GCM") takes a 192-bit
 * random nonce, derives a fresh AES-256-GCM key per value from the first 96
 * bits (two AES blocks under the master key, CMAC-style) and uses the other
 * 96 as the GCM nonce: random nonces are then safe for any number of
 * values a fleet can write.  It costs two AES blocks and a GCM key set-up
 * per value (well under a microsecond), against 70 us of GCM for a 256 KiB
 * chunk at 3.8 GB/s.  The published test vectors are checked by
 * tests/test_seal.c.
 *
 * Keys: HKDF-SHA256 (libcrypto, no salt) of the secret with the info
 * "kvoffload seal v1: XAES-256-GCM key" gives the master key; with
 * "kvoffload seal v1: key id" its 8-byte id, written into each value so
 * that a reader picks the current or the previous key (a fleet rotating
 * its secret) without trying both.  Secrets are never kept; the derived
 * keys are wiped at destroy.
 *
 * Contexts: an op holds a GCM context and one AES-256-ECB context per key
 * (the XAES derivation), keyed when the op is made; ops are pooled under
 * the seal's mutex (the steady state allocates nothing).  The payload goes
 * through EVP_*Update in pieces of at most 1 GiB (int lengths); GCM never
 * buffers, so an update's output is exactly its input's length and
 * decryption can run in place as a value arrives.
 */
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>

#include "tiers/seal.h"

#if KVO_HAVE_OPENSSL
#include <openssl/core_names.h>
#include <openssl/crypto.h>
#include <openssl/err.h>
#include <openssl/evp.h>
#include <openssl/kdf.h>
#include <openssl/params.h>
#include <openssl/rand.h>

#define PIECE_MAX ((size_t)1 << 30)
#define INFO_KEY "kvoffload seal v1: XAES-256-GCM key"
#define INFO_ID "kvoffload seal v1: key id"

typedef struct seal_key {
    unsigned char aes[32];  /* master key */
    unsigned char k1[16];   /* XAES: AES_K(0^128) doubled in GF(2^128) */
    unsigned char id[8];
} seal_key;

struct kvo__seal {
    seal_key key[2];        /* [0] seals and opens; [1] (previous) opens */
    int n_keys;
    EVP_CIPHER *gcm, *ecb;
    pthread_mutex_t mu;     /* guards free_ops and all_ops */
    kvo__seal_op *free_ops, *all_ops;
};

struct kvo__seal_op {
    kvo__seal_op *next, *all_next;
    const kvo__seal *s;
    EVP_CIPHER_CTX *gcm;
    EVP_CIPHER_CTX *ecb[2]; /* keyed with s->key[i] */
};

bool kvo__seal_available(void) { return true; }

static int ossl_error(const char *what) {
    char buf[256] = "unknown error";
    unsigned long e = ERR_get_error();
    if (e) ERR_error_string_n(e, buf, sizeof buf);
    ERR_clear_error();
    return kvo__error(KVO_EIO, "%s: libcrypto failed: %s", what, buf);
}

/* out = HKDF-SHA256(ikm, info), n bytes.  1 ok. */
static int hkdf(const void *ikm, size_t ikm_len, const char *info, unsigned char *out, size_t n) {
    EVP_KDF *kdf = EVP_KDF_fetch(NULL, "HKDF", NULL);
    EVP_KDF_CTX *k = kdf ? EVP_KDF_CTX_new(kdf) : NULL;
    OSSL_PARAM params[] = {
        OSSL_PARAM_construct_utf8_string(OSSL_KDF_PARAM_DIGEST, (char *)"SHA256", 0),
        OSSL_PARAM_construct_octet_string(OSSL_KDF_PARAM_KEY, (void *)(uintptr_t)ikm, ikm_len),
        OSSL_PARAM_construct_octet_string(OSSL_KDF_PARAM_INFO, (void *)(uintptr_t)info, strlen(info)),
        OSSL_PARAM_construct_end()};
    int ok = k && EVP_KDF_derive(k, out, n, params) == 1;
    EVP_KDF_CTX_free(k);
    EVP_KDF_free(kdf);
    return ok;
}

/* An AES-256-ECB context keyed with aes (no padding), or NULL. */
static EVP_CIPHER_CTX *ecb_ctx(EVP_CIPHER *ecb, const unsigned char aes[32]) {
    EVP_CIPHER_CTX *c = EVP_CIPHER_CTX_new();
    if (c && (EVP_EncryptInit_ex2(c, ecb, aes, NULL, NULL) != 1 || EVP_CIPHER_CTX_set_padding(c, 0) != 1)) {
        EVP_CIPHER_CTX_free(c);
        c = NULL;
    }
    return c;
}

/* One 16-byte multiple of ECB blocks. */
static int ecb_blocks(EVP_CIPHER_CTX *c, const unsigned char *in, unsigned char *out, int n) {
    int outl = 0;
    return EVP_EncryptUpdate(c, out, &outl, in, n) == 1 && outl == n;
}

/* K1 of XAES: L = AES_K(0^128), K1 = L << 1, xor 0x87 into the last byte
 * when L's top bit was set (CMAC's subkey).  1 ok. */
static int key_setup(seal_key *k, EVP_CIPHER *ecb) {
    unsigned char zero[16] = {0}, l[16];
    EVP_CIPHER_CTX *c = ecb_ctx(ecb, k->aes);
    int ok = c && ecb_blocks(c, zero, l, 16);
    EVP_CIPHER_CTX_free(c);
    if (!ok) return 0;
    for (int i = 0; i < 16; i++) k->k1[i] = (unsigned char)((l[i] << 1) | (i < 15 ? l[i + 1] >> 7 : 0));
    if (l[0] & 0x80) k->k1[15] ^= 0x87;
    OPENSSL_cleanse(l, sizeof l);
    return 1;
}

/* The per-value GCM key: AES_K(M1 ^ K1) || AES_K(M2 ^ K1), Mi = 0x00 i 'X'
 * 0x00 || nonce[0..12). */
static int derive(EVP_CIPHER_CTX *ecb, const seal_key *k, const unsigned char *nonce, unsigned char kx[32]) {
    unsigned char m[32];
    for (int b = 0; b < 2; b++) {
        unsigned char *p = m + 16 * b;
        p[0] = 0;
        p[1] = (unsigned char)(b + 1);
        p[2] = 'X';
        p[3] = 0;
        memcpy(p + 4, nonce, 12);
        for (int i = 0; i < 16; i++) p[i] ^= k->k1[i];
    }
    return ecb_blocks(ecb, m, kx, 32);
}

static int derive_key(const char *secret, seal_key *k, EVP_CIPHER *ecb) {
    size_t len = strlen(secret);
    return hkdf(secret, len, INFO_KEY, k->aes, sizeof k->aes) && hkdf(secret, len, INFO_ID, k->id, sizeof k->id) &&
           key_setup(k, ecb);
}

void kvo__seal_destroy(kvo__seal *s) {
    if (!s) return;
    for (kvo__seal_op *op = s->all_ops, *n; op; op = n) {
        n = op->all_next;
        EVP_CIPHER_CTX_free(op->gcm);
        EVP_CIPHER_CTX_free(op->ecb[0]);
        EVP_CIPHER_CTX_free(op->ecb[1]);
        kvo__free(op);
    }
    EVP_CIPHER_free(s->gcm);
    EVP_CIPHER_free(s->ecb);
    pthread_mutex_destroy(&s->mu);
    OPENSSL_cleanse(s->key, sizeof s->key);
    kvo__free(s);
}

int kvo__seal_create(const char *secret, const char *previous, const char *what, kvo__seal **out) {
    *out = NULL;
    if (!secret || strlen(secret) < KVO__SEAL_SECRET_MIN || (previous && previous[0] &&
                                                             strlen(previous) < KVO__SEAL_SECRET_MIN))
        return kvo__error(KVO_EINVAL, "%s: a secret is shorter than %u bytes (use a long random string, e.g. "
                          "`openssl rand -base64 32`)", what, KVO__SEAL_SECRET_MIN);
    kvo__seal *s = kvo__calloc(1, sizeof *s);
    if (!s) return kvo__error(KVO_ENOMEM, "%s: out of memory", what);
    pthread_mutex_init(&s->mu, NULL);
    s->gcm = EVP_CIPHER_fetch(NULL, "AES-256-GCM", NULL);
    s->ecb = EVP_CIPHER_fetch(NULL, "AES-256-ECB", NULL);
    int ok = s->gcm && s->ecb && derive_key(secret, &s->key[0], s->ecb);
    s->n_keys = 1;
    if (ok && previous && previous[0]) {
        ok = derive_key(previous, &s->key[1], s->ecb);
        if (memcmp(s->key[1].id, s->key[0].id, sizeof s->key[0].id) != 0) s->n_keys = 2;
    }
    if (!ok) {
        int rc = ossl_error(what);
        kvo__seal_destroy(s);
        return rc;
    }
    *out = s;
    return 0;
}

kvo__seal_op *kvo__seal_op_take(kvo__seal *s) {
    pthread_mutex_lock(&s->mu);
    kvo__seal_op *op = s->free_ops;
    if (op) s->free_ops = op->next;
    pthread_mutex_unlock(&s->mu);
    if (op) return op;
    op = kvo__calloc(1, sizeof *op);
    if (!op) {
        kvo__error(KVO_ENOMEM, "sealing: out of memory for a cipher context");
        return NULL;
    }
    op->s = s;
    op->gcm = EVP_CIPHER_CTX_new();
    bool ok = op->gcm && EVP_CipherInit_ex2(op->gcm, s->gcm, NULL, NULL, 1, NULL) == 1;
    for (int i = 0; i < s->n_keys && ok; i++) ok = (op->ecb[i] = ecb_ctx(s->ecb, s->key[i].aes)) != NULL;
    pthread_mutex_lock(&s->mu);
    op->all_next = s->all_ops; /* freed at destroy, also when not usable */
    s->all_ops = op;
    pthread_mutex_unlock(&s->mu);
    if (!ok) {
        ossl_error("sealing: a cipher context");
        return NULL;
    }
    return op;
}

void kvo__seal_op_give(kvo__seal *s, kvo__seal_op *op) {
    if (!op) return;
    pthread_mutex_lock(&s->mu);
    op->next = s->free_ops;
    s->free_ops = op;
    pthread_mutex_unlock(&s->mu);
}

static void put32(unsigned char *p, uint32_t v) {
    for (int i = 0; i < 4; i++) p[i] = (unsigned char)(v >> (8 * i));
}
static uint32_t get32(const unsigned char *p) { return p[0] | p[1] << 8 | p[2] << 16 | (uint32_t)p[3] << 24; }

/* GCM over n bytes src -> dst in pieces (enc or dec as the context was
 * initialised).  1 ok. */
static int gcm_update(EVP_CIPHER_CTX *c, unsigned char *dst, const unsigned char *src, size_t n) {
    for (size_t off = 0; off < n;) {
        int k = (int)(n - off < PIECE_MAX ? n - off : PIECE_MAX), outl = 0;
        if (EVP_CipherUpdate(c, dst + off, &outl, src + off, k) != 1 || outl != k) return 0;
        off += (size_t)k;
    }
    return 1;
}

/* Key the op's GCM context for key i and nonce; feed the authenticated
 * data (header bytes 0..303, then name).  1 ok. */
static int gcm_start(kvo__seal_op *op, int i, const unsigned char *hdr, const void *name, size_t name_len, int enc) {
    unsigned char kx[32];
    int outl = 0;
    int ok = derive(op->ecb[i], &op->s->key[i], hdr + KVO__SEAL_NONCE_OFF, kx) &&
             EVP_CipherInit_ex2(op->gcm, NULL, kx, hdr + KVO__SEAL_NONCE_OFF + 12, enc, NULL) == 1 &&
             EVP_CipherUpdate(op->gcm, NULL, &outl, hdr, (int)KVO__SEAL_TAG_OFF) == 1 &&
             (!name_len || EVP_CipherUpdate(op->gcm, NULL, &outl, name, (int)name_len) == 1);
    OPENSSL_cleanse(kx, sizeof kx);
    return ok;
}

int kvo__seal_value(kvo__seal_op *op, unsigned char *hdr, const void *name, size_t name_len, void *dst,
                    const void *src, size_t n) {
    const seal_key *k = &op->s->key[0];
    put32(hdr + KVO__SEAL_REC_OFF, KVO__SEAL_ALG_XAES_256_GCM);
    put32(hdr + KVO__SEAL_REC_OFF + 4, 0);
    memcpy(hdr + KVO__SEAL_KEYID_OFF, k->id, sizeof k->id);
    unsigned char fin[16];
    int outl = 0;
    if (RAND_bytes(hdr + KVO__SEAL_NONCE_OFF, KVO__SEAL_NONCE_BYTES) != 1 || !gcm_start(op, 0, hdr, name, name_len, 1) ||
        !gcm_update(op->gcm, dst, src, n) || EVP_CipherFinal_ex(op->gcm, fin, &outl) != 1 ||
        EVP_CIPHER_CTX_ctrl(op->gcm, EVP_CTRL_GCM_GET_TAG, KVO__SEAL_TAG_BYTES, hdr + KVO__SEAL_TAG_OFF) != 1)
        return ossl_error("sealing a chunk");
    return 0;
}

int kvo__seal_open_begin(kvo__seal_op *op, const unsigned char *hdr, const void *name, size_t name_len) {
    if (get32(hdr + KVO__SEAL_REC_OFF) != KVO__SEAL_ALG_XAES_256_GCM || get32(hdr + KVO__SEAL_REC_OFF + 4) != 0)
        return kvo__error(KVO_ECORRUPT, "not sealed (no XAES-256-GCM record): written without a secret, or forged");
    int i = 0;
    while (i < op->s->n_keys && memcmp(hdr + KVO__SEAL_KEYID_OFF, op->s->key[i].id, 8) != 0) i++;
    if (i == op->s->n_keys) {
        const unsigned char *id = hdr + KVO__SEAL_KEYID_OFF;
        return kvo__error(KVO_ECORRUPT, "sealed under key id %02x%02x%02x%02x%02x%02x%02x%02x, which is neither "
                          "this tier's secret nor its previous one", id[0], id[1], id[2], id[3], id[4], id[5], id[6],
                          id[7]);
    }
    if (!gcm_start(op, i, hdr, name, name_len, 0)) return ossl_error("opening a sealed chunk");
    return 0;
}

int kvo__seal_open_update(kvo__seal_op *op, void *dst, const void *src, size_t n) {
    return gcm_update(op->gcm, dst, src, n) ? 0 : ossl_error("opening a sealed chunk");
}

int kvo__seal_open_end(kvo__seal_op *op, const unsigned char *hdr) {
    unsigned char fin[16];
    int outl = 0;
    if (EVP_CIPHER_CTX_ctrl(op->gcm, EVP_CTRL_GCM_SET_TAG, KVO__SEAL_TAG_BYTES,
                            (void *)(uintptr_t)(hdr + KVO__SEAL_TAG_OFF)) != 1 ||
        EVP_CipherFinal_ex(op->gcm, fin, &outl) != 1) {
        ERR_clear_error();
        return kvo__error(KVO_ECORRUPT, "failed authentication: tampered with, forged, or moved from another key");
    }
    return 0;
}

#ifdef KVO_TESTING
int kvo__seal_test_xaes(const unsigned char key[32], const unsigned char nonce[24], const void *aad, size_t aad_len,
                        const void *pt, size_t n, unsigned char *ct, unsigned char tag[16]) {
    EVP_CIPHER *gcm = EVP_CIPHER_fetch(NULL, "AES-256-GCM", NULL), *ecb = EVP_CIPHER_fetch(NULL, "AES-256-ECB", NULL);
    seal_key k;
    memcpy(k.aes, key, 32);
    EVP_CIPHER_CTX *e = NULL, *c = EVP_CIPHER_CTX_new();
    unsigned char kx[32], fin[16];
    int outl = 0;
    int ok = gcm && ecb && c && key_setup(&k, ecb) && (e = ecb_ctx(ecb, key)) != NULL && derive(e, &k, nonce, kx) &&
             EVP_EncryptInit_ex2(c, gcm, kx, nonce + 12, NULL) == 1 &&
             (!aad_len || EVP_EncryptUpdate(c, NULL, &outl, aad, (int)aad_len) == 1) && gcm_update(c, ct, pt, n) &&
             EVP_EncryptFinal_ex(c, fin, &outl) == 1 && EVP_CIPHER_CTX_ctrl(c, EVP_CTRL_GCM_GET_TAG, 16, tag) == 1;
    EVP_CIPHER_CTX_free(c);
    EVP_CIPHER_CTX_free(e);
    EVP_CIPHER_free(gcm);
    EVP_CIPHER_free(ecb);
    return ok ? 0 : ossl_error("XAES test");
}
#endif

#else /* !KVO_HAVE_OPENSSL */

struct kvo__seal {
    int unused;
};

bool kvo__seal_available(void) { return false; }

int kvo__seal_create(const char *secret, const char *previous, const char *what, kvo__seal **out) {
    (void)secret;
    (void)previous;
    *out = NULL;
    return kvo__error(KVO_ENOTSUP, "%s: sealing needs OpenSSL's libcrypto, and this build has none (install "
                      "libssl-dev and configure with -DKVO_WITH_OPENSSL=ON), so a secret cannot be used", what);
}

void kvo__seal_destroy(kvo__seal *s) { (void)s; }

kvo__seal_op *kvo__seal_op_take(kvo__seal *s) {
    (void)s;
    kvo__error(KVO_ENOTSUP, "sealing: built without OpenSSL");
    return NULL;
}

void kvo__seal_op_give(kvo__seal *s, kvo__seal_op *op) {
    (void)s;
    (void)op;
}

int kvo__seal_value(kvo__seal_op *op, unsigned char *hdr, const void *name, size_t name_len, void *dst,
                    const void *src, size_t n) {
    (void)op, (void)hdr, (void)name, (void)name_len, (void)dst, (void)src, (void)n;
    return kvo__error(KVO_ENOTSUP, "sealing: built without OpenSSL");
}

int kvo__seal_open_begin(kvo__seal_op *op, const unsigned char *hdr, const void *name, size_t name_len) {
    (void)op, (void)hdr, (void)name, (void)name_len;
    return kvo__error(KVO_ENOTSUP, "sealing: built without OpenSSL");
}

int kvo__seal_open_update(kvo__seal_op *op, void *dst, const void *src, size_t n) {
    (void)op, (void)dst, (void)src, (void)n;
    return kvo__error(KVO_ENOTSUP, "sealing: built without OpenSSL");
}

int kvo__seal_open_end(kvo__seal_op *op, const unsigned char *hdr) {
    (void)op, (void)hdr;
    return kvo__error(KVO_ENOTSUP, "sealing: built without OpenSSL");
}

#ifdef KVO_TESTING
int kvo__seal_test_xaes(const unsigned char key[32], const unsigned char nonce[24], const void *aad, size_t aad_len,
                        const void *pt, size_t n, unsigned char *ct, unsigned char tag[16]) {
    (void)key, (void)nonce, (void)aad, (void)aad_len, (void)pt, (void)n, (void)ct, (void)tag;
    return kvo__error(KVO_ENOTSUP, "sealing: built without OpenSSL");
}
#endif

#endif /* KVO_HAVE_OPENSSL */

int kvo__seal_open(kvo__seal_op *op, const unsigned char *hdr, const void *name, size_t name_len, void *dst,
                   const void *src, size_t n) {
    int rc = kvo__seal_open_begin(op, hdr, name, name_len);
    if (!rc) rc = kvo__seal_open_update(op, dst, src, n);
    if (!rc) rc = kvo__seal_open_end(op, hdr);
    return rc;
}
