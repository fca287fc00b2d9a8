/* Sealing (src/tiers/seal.c) on its own, without a tier:
 *  - XAES-256-GCM gives C2SP's published test vectors;
 *  - a sealed payload opens with the same secret (whole, and in pieces of
 *    any size as the Redis reader feeds it), and with a seal that holds it
 *    as its previous secret (rotation);
 *  - a flipped payload byte, a changed header byte, another name, another
 *    secret, an unsealed header each fail (KVO_ECORRUPT);
 *  - nonces are fresh: the same bytes sealed twice differ;
 *  - a short secret is refused without showing it; a build without OpenSSL
 *    refuses any secret with KVO_ENOTSUP. */
#include "kvo_test.h"

#include <stdlib.h>

#include "tiers/seal.h"

#define SECRET_A "correct horse battery staple A1"
#define SECRET_B "another-fleet-secret-of-32-bytes"

static void need_openssl(void) {
    if (!kvo__seal_available()) SKIP("built without OpenSSL");
}

static void unhex(const char *h, unsigned char *out) {
    for (size_t i = 0; h[2 * i]; i++) {
        unsigned v = 0;
        sscanf(h + 2 * i, "%2x", &v);
        out[i] = (unsigned char)v;
    }
}

KVO_TEST(xaes_256_gcm_test_vectors) {
    need_openssl();
    /* C2SP XAES-256-GCM.md, the two vectors of the specification */
    static const struct {
        unsigned char key_byte;
        const char *aad, *ct, *tag;
    } v[] = {{0x01, "", "ce546ef63c9cc60765923609", "b33a9a1974e96e52daf2fcf7075e2271"},
             {0x03, "c2sp.org/XAES-256-GCM", "986ec1832593df5443a17943", "7fd083bf3fdb41abd740a21f71eb769d"}};
    for (size_t i = 0; i < 2; i++) {
        unsigned char key[32], ct[12], tag[16], want_ct[12], want_tag[16];
        memset(key, v[i].key_byte, sizeof key);
        unhex(v[i].ct, want_ct);
        unhex(v[i].tag, want_tag);
        ASSERT_OK(kvo__seal_test_xaes(key, (const unsigned char *)"ABCDEFGHIJKLMNOPQRSTUVWX", v[i].aad,
                                      strlen(v[i].aad), "XAES-256-GCM", 12, ct, tag));
        ASSERT_MEM_EQ(ct, want_ct, 12);
        ASSERT_MEM_EQ(tag, want_tag, 16);
    }
}

enum { PAY = 300000 };

typedef struct sealed {
    unsigned char hdr[4096];
    unsigned char *pay, *plain;
} sealed;

/* A header with bytes 0..263 set to something (the seal only reads the
 * record), a payload of PAY bytes, sealed under s with name. */
static void make_sealed(kvo__seal *s, const char *name, sealed *v) {
    for (int i = 0; i < 264; i++) v->hdr[i] = (unsigned char)(i * 7 + 1);
    memset(v->hdr + 264, 0, 4096 - 264);
    v->plain = malloc(PAY);
    v->pay = malloc(PAY);
    for (size_t i = 0; i < PAY; i++) v->plain[i] = (unsigned char)(i * 131 + (i >> 11));
    kvo__seal_op *op = kvo__seal_op_take(s);
    ASSERT_NOT_NULL(op);
    ASSERT_OK(kvo__seal_value(op, v->hdr, name, strlen(name), v->pay, v->plain, PAY));
    kvo__seal_op_give(s, op);
}

static void free_sealed(sealed *v) {
    free(v->pay);
    free(v->plain);
}

/* Open v (a copy: the payload is decrypted in place) with s and name. */
static int open_copy(kvo__seal *s, const sealed *v, const char *name, unsigned char *out) {
    kvo__seal_op *op = kvo__seal_op_take(s);
    ASSERT_NOT_NULL(op);
    memcpy(out, v->pay, PAY);
    int rc = kvo__seal_open(op, v->hdr, name, strlen(name), out, out, PAY);
    kvo__seal_op_give(s, op);
    return rc;
}

KVO_TEST(sealed_payload_opens_whole_and_in_pieces) {
    need_openssl();
    kvo__seal *s = NULL;
    ASSERT_OK(kvo__seal_create(SECRET_A, NULL, "test", &s));
    sealed v;
    make_sealed(s, "kvo:fp:key-g0", &v);
    ASSERT_TRUE(memcmp(v.pay, v.plain, PAY) != 0);
    size_t same = 0;
    for (size_t i = 0; i < PAY; i++) same += v.pay[i] == v.plain[i];
    ASSERT_LT_U64(same, PAY / 100); /* about 1 in 256 by chance */
    unsigned char *out = malloc(PAY);
    ASSERT_OK(open_copy(s, &v, "kvo:fp:key-g0", out));
    ASSERT_MEM_EQ(out, v.plain, PAY);
    /* in pieces of odd sizes, from the sealed bytes into another buffer */
    kvo__seal_op *op = kvo__seal_op_take(s);
    ASSERT_OK(kvo__seal_open_begin(op, v.hdr, "kvo:fp:key-g0", 13));
    memset(out, 0, PAY);
    for (size_t off = 0, k = 1; off < PAY; off += k, k = k * 3 + 7) {
        if (off + k > PAY) k = PAY - off;
        ASSERT_OK(kvo__seal_open_update(op, out + off, v.pay + off, k));
    }
    ASSERT_OK(kvo__seal_open_end(op, v.hdr));
    ASSERT_MEM_EQ(out, v.plain, PAY);
    kvo__seal_op_give(s, op);
    free(out);
    free_sealed(&v);
    kvo__seal_destroy(s);
}

KVO_TEST(tampered_moved_or_foreign_values_fail) {
    need_openssl();
    kvo__seal *a = NULL, *b = NULL;
    ASSERT_OK(kvo__seal_create(SECRET_A, NULL, "test", &a));
    ASSERT_OK(kvo__seal_create(SECRET_B, NULL, "test", &b));
    const char *name = "tenant-a:fp:00ff-g0";
    sealed v;
    make_sealed(a, name, &v);
    unsigned char *out = malloc(PAY);
    ASSERT_OK(open_copy(a, &v, name, out)); /* the control: it opens */
    v.pay[PAY / 2] ^= 1; /* a payload bit */
    ASSERT_ERR(open_copy(a, &v, name, out), KVO_ECORRUPT);
    ASSERT_CONTAINS(kvo_last_error(), "failed authentication");
    v.pay[PAY / 2] ^= 1;
    static const int offsets[] = {0, 33, 100, 263, 264, 272, 290, 303, 310}; /* header, record, nonce, tag */
    for (size_t i = 0; i < sizeof offsets / sizeof offsets[0]; i++) {
        v.hdr[offsets[i]] ^= 0x40;
        ASSERT_ERR(open_copy(a, &v, name, out), KVO_ECORRUPT);
        v.hdr[offsets[i]] ^= 0x40;
    }
    v.hdr[400] ^= 1; /* beyond the record: not part of the value's meaning */
    ASSERT_OK(open_copy(a, &v, name, out));
    v.hdr[400] ^= 1;
    ASSERT_ERR(open_copy(a, &v, "tenant-b:fp:00ff-g0", out), KVO_ECORRUPT); /* moved to another name */
    ASSERT_ERR(open_copy(b, &v, name, out), KVO_ECORRUPT);                  /* another secret */
    ASSERT_CONTAINS(kvo_last_error(), "key id");
    ASSERT_TRUE(strstr(kvo_last_error(), SECRET_A) == NULL && strstr(kvo_last_error(), SECRET_B) == NULL);
    memset(v.hdr + 264, 0, 56); /* no record: an unsealed value */
    ASSERT_ERR(open_copy(a, &v, name, out), KVO_ECORRUPT);
    ASSERT_CONTAINS(kvo_last_error(), "not sealed");
    free(out);
    free_sealed(&v);
    kvo__seal_destroy(a);
    kvo__seal_destroy(b);
}

KVO_TEST(previous_secret_opens_during_rotation) {
    need_openssl();
    kvo__seal *old = NULL, *rotated = NULL, *only_new = NULL;
    ASSERT_OK(kvo__seal_create(SECRET_A, NULL, "test", &old));
    ASSERT_OK(kvo__seal_create(SECRET_B, SECRET_A, "test", &rotated));
    ASSERT_OK(kvo__seal_create(SECRET_B, "", "test", &only_new));
    sealed by_old, by_new;
    make_sealed(old, "k", &by_old);
    make_sealed(rotated, "k", &by_new); /* seals with the new secret */
    unsigned char *out = malloc(PAY);
    ASSERT_OK(open_copy(rotated, &by_old, "k", out)); /* previous: still read */
    ASSERT_MEM_EQ(out, by_old.plain, PAY);
    ASSERT_OK(open_copy(rotated, &by_new, "k", out));
    ASSERT_OK(open_copy(only_new, &by_new, "k", out));
    ASSERT_ERR(open_copy(only_new, &by_old, "k", out), KVO_ECORRUPT); /* rotation over */
    ASSERT_ERR(open_copy(old, &by_new, "k", out), KVO_ECORRUPT);      /* an engine not yet rotated */
    free(out);
    free_sealed(&by_old);
    free_sealed(&by_new);
    kvo__seal_destroy(old);
    kvo__seal_destroy(rotated);
    kvo__seal_destroy(only_new);
}

KVO_TEST(nonces_are_fresh) {
    need_openssl();
    kvo__seal *s = NULL;
    ASSERT_OK(kvo__seal_create(SECRET_A, NULL, "test", &s));
    sealed v1, v2;
    make_sealed(s, "k", &v1);
    make_sealed(s, "k", &v2); /* the same header, name and bytes */
    ASSERT_TRUE(memcmp(v1.hdr + KVO__SEAL_NONCE_OFF, v2.hdr + KVO__SEAL_NONCE_OFF, KVO__SEAL_NONCE_BYTES) != 0);
    ASSERT_TRUE(memcmp(v1.pay, v2.pay, 64) != 0);
    ASSERT_MEM_EQ(v1.hdr + KVO__SEAL_KEYID_OFF, v2.hdr + KVO__SEAL_KEYID_OFF, 8); /* one key */
    free_sealed(&v1);
    free_sealed(&v2);
    kvo__seal_destroy(s);
}

KVO_TEST(short_secret_refused_without_showing_it) {
    kvo__seal *s = NULL;
    if (!kvo__seal_available()) {
        ASSERT_ERR(kvo__seal_create(SECRET_A, NULL, "remote tier: remote_secret", &s), KVO_ENOTSUP);
        ASSERT_CONTAINS(kvo_last_error(), "OpenSSL");
        ASSERT_TRUE(strstr(kvo_last_error(), SECRET_A) == NULL);
        ASSERT_NULL(s);
        return;
    }
    ASSERT_ERR(kvo__seal_create("Sh0rt-S3cret", NULL, "remote tier: remote_secret", &s), KVO_EINVAL);
    ASSERT_CONTAINS(kvo_last_error(), "16 bytes");
    ASSERT_CONTAINS(kvo_last_error(), "remote_secret");
    ASSERT_TRUE(strstr(kvo_last_error(), "Sh0rt") == NULL);
    ASSERT_ERR(kvo__seal_create(SECRET_A, "Sh0rt-Prev", "test", &s), KVO_EINVAL); /* the previous one too */
    ASSERT_TRUE(strstr(kvo_last_error(), "Sh0rt") == NULL);
    ASSERT_NULL(s);
    ASSERT_OK(kvo__seal_create("exactly16bytes!!", NULL, "test", &s)); /* the boundary */
    kvo__seal_destroy(s);
}
