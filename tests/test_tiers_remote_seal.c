/* The Redis tier with a fleet secret (issue 50 item 3): every value sealed
 * (XAES-256-GCM, bound to its key name and header), against the shared
 * cluster (KVO_TEST_REDIS; skipped without it, or without OpenSSL):
 *  - sealed values load back byte-exact, and what Redis holds is version 2
 *    with a payload that is not the chunk's bytes;
 *  - a forged value (a well-formed unsealed header with both checksums
 *    right: what anyone allowed to SET can write) loads as a hit without a
 *    secret -- the defect -- and is a miss counted in auth_failed with one;
 *    so are values sealed under another secret, tampered payload or seal
 *    bytes, and a sealed value copied under another tenant's prefix; none of
 *    them is deleted (corrupt_deleted stays 0);
 *  - rotation: a tier with the new secret and the old one as previous reads
 *    both; an engine with the old secret only misses the new values;
 *  - the secret from KVO_REMOTE_SECRET when params give none;
 *  - gets answered from a queued put (reads right after puts) open the
 *    sealed staging bytes;
 *  - short secrets and a previous secret alone are refused without being
 *    shown. */
#include "remote_test.h"

#if KVO_HAVE_REDIS
#include <hiredis/hiredis.h>

#include "tiers/remote/remote_internal.h" /* kvo__remote_test_hold_puts, the reader */
#endif
#include "tiers/seal.h"

#define S1 "fleet-secret-one-0123456789abcdef"
#define S2 "fleet-secret-two-fedcba9876543210"

static void need_seal(void) {
    if (!kvo__seal_available()) SKIP("built without OpenSSL");
}

static kvo_remote_tier *open_sealed(int port, const kvo_plan *plan, const char *pfx, const char *secret,
                                    const char *previous) {
    return open_tier_sealed(port, plan, pfx, NULL, secret, previous);
}

/* The raw value of key i (malloc'd, *len bytes) via redis-cli. */
static unsigned char *raw_get(kvo_remote_tier *t, int port, uint64_t i, size_t *len) {
    char name[160], path[600], cmd[1200];
    kvo_chunk_key k = ftf_key(i, 0);
    ASSERT_OK(kvo_remote_tier_key_name(t, &k, name, sizeof name));
    snprintf(path, sizeof path, "%s/raw-%llu.bin", kvo_test_tmpdir(), (unsigned long long)i);
    snprintf(cmd, sizeof cmd, "redis-cli -c -h 127.0.0.1 -p %d get %s > %s", port, name, path);
    ASSERT_EQ_INT(kvo_test_run(cmd, NULL), 0);
    unsigned char *v = (unsigned char *)kvo_test_read_file(path, len);
    ASSERT_NOT_NULL(v);
    if (*len && v[*len - 1] == '\n') (*len)--; /* redis-cli ends the value with a newline */
    return v;
}

/* SET key i of tier t to the len bytes of v (through a file: binary safe). */
static void raw_set(kvo_remote_tier *t, int port, uint64_t i, const unsigned char *v, size_t len) {
    char name[160], path[600], cmd[1200];
    kvo_chunk_key k = ftf_key(i, 0);
    ASSERT_OK(kvo_remote_tier_key_name(t, &k, name, sizeof name));
    snprintf(path, sizeof path, "%s/set.bin", kvo_test_tmpdir());
    FILE *f = fopen(path, "wb");
    ASSERT_NOT_NULL(f);
    ASSERT_EQ_U64(fwrite(v, 1, len, f), len);
    fclose(f);
    snprintf(cmd, sizeof cmd, "redis-cli -c -h 127.0.0.1 -p %d -x set %s < %s", port, name, path);
    ASSERT_EQ_INT(kvo_test_run(cmd, NULL), 0);
}

static uint32_t get32le(const unsigned char *p) { return p[0] | p[1] << 8 | p[2] << 16 | (uint32_t)p[3] << 24; }

KVO_TEST(sealed_values_load_back_and_hide_their_bytes) {
    int port = shared_port();
    need_seal();
    kvo_plan *plan = make_plan();
    kvo_remote_tier *t = open_sealed(port, plan, prefix("seal-rt"), S1, NULL);
    enum { N = 12 };
    ASSERT_EQ_U64(put_range(t, plan, 0, N), N);
    ASSERT_EQ_U64(get_range(t, plan, 0, N, NULL), N); /* byte-exact (get_range checks) */
    uint64_t cb = chunk_bytes(plan);
    size_t len = 0;
    unsigned char *v = raw_get(t, port, 3, &len), *plain = malloc(cb);
    ASSERT_EQ_U64(len, KVO_REMOTE_HEADER_BYTES + cb);
    ASSERT_EQ_INT(get32le(v + 8), 2);                       /* format version: sealed */
    ASSERT_EQ_INT(get32le(v + KVO__SEAL_REC_OFF), KVO__SEAL_ALG_XAES_256_GCM);
    kvo_chunk_key k = ftf_key(3, 0);
    ftf_fill(plain, cb, &k);
    size_t same = 0;
    for (uint64_t i = 0; i < cb; i++) same += v[KVO_REMOTE_HEADER_BYTES + i] == plain[i];
    ASSERT_LT_U64(same, cb / 64); /* ciphertext: about 1 byte in 256 agrees by chance */
    kvo_remote_tier_stats s = stats(t);
    ASSERT_EQ_U64(s.auth_failed, 0);
    ASSERT_EQ_U64(s.gets, N);
    free(v);
    free(plain);
    kvo_remote_tier_destroy(t);
    kvo_plan_destroy(plan);
}

/* A value anyone allowed to SET can write: a well-formed unsealed header
 * for key i with both checksums right, over bytes of their choosing. */
static unsigned char *forge(const kvo_plan *plan, uint64_t i) {
    uint64_t cb = chunk_bytes(plan);
    unsigned char *val = malloc(KVO_REMOTE_HEADER_BYTES + cb);
    memset(val + KVO_REMOTE_HEADER_BYTES, 0x5a, cb); /* the attacker's "KV" */
    kvo_chunk_key k = ftf_key(i, 0);
    kvo__file_hdr h;
    kvo__file_hdr_init(&h, plan, 0, kvo_plan_group(plan, 0), &k, XXH3_64bits(val + KVO_REMOTE_HEADER_BYTES, cb));
    kvo__file_hdr_encode(&h, val);
    return val;
}

KVO_TEST(forged_foreign_or_tampered_values_fail_authentication) {
    int port = shared_port();
    need_seal();
    kvo_plan *plan = make_plan();
    uint64_t cb = chunk_bytes(plan);
    const char *pfx = prefix("seal-auth");
    /* the defect, without a secret: a forged value is a verified hit */
    kvo_remote_tier *plain = open_sealed(port, plan, pfx, "", NULL);
    unsigned char *forged = forge(plan, 0);
    raw_set(plain, port, 0, forged, KVO_REMOTE_HEADER_BYTES + cb);
    unsigned char *dst = malloc(cb);
    void *d = dst;
    kvo_chunk_key k0 = ftf_key(0, 0);
    ASSERT_OK(kvo_remote_tier_get(plain, &k0, &d, 1, NULL, NULL, NULL));
    ASSERT_OK(kvo_remote_tier_wait(plain, KVO_MS(30000)));
    kvo_remote_completion c;
    size_t n = 0;
    ASSERT_OK(kvo_remote_tier_poll(plain, &c, 1, &n));
    ASSERT_EQ_U64(n, 1);
    ASSERT_EQ_INT(c.result, 0);
    ASSERT_MEM_EQ(dst, forged + KVO_REMOTE_HEADER_BYTES, cb); /* the forged bytes, delivered */
    /* with the secret: a miss, counted, not deleted */
    kvo_remote_tier *t = open_sealed(port, plan, pfx, S1, NULL);
    int res[8];
    ASSERT_EQ_U64(get_range(t, plan, 0, 1, res), 0);
    ASSERT_EQ_INT(res[0], KVO_ECORRUPT);
    ASSERT_EQ_U64(stats(t).auth_failed, 1);
    ASSERT_EQ_U64(stats(t).corrupt_deleted, 0);
    ASSERT_EQ_INT(exists_one(t, &k0), 0);
    /* values sealed under another secret: misses for t, hits for their own */
    kvo_remote_tier *other = open_sealed(port, plan, pfx, S2, NULL);
    ASSERT_EQ_U64(put_range(other, plan, 1, 3), 3);
    ASSERT_EQ_U64(get_range(t, plan, 1, 3, res), 0);
    for (int i = 0; i < 3; i++) ASSERT_EQ_INT(res[i], KVO_ECORRUPT);
    ASSERT_EQ_U64(stats(t).auth_failed, 4);
    ASSERT_EQ_U64(get_range(other, plan, 1, 3, NULL), 3);
    /* a tier without a secret cannot use sealed values either */
    ASSERT_EQ_U64(get_range(plain, plan, 1, 3, res), 0);
    ASSERT_EQ_U64(stats(plain).auth_failed, 3);
    /* tampered: a payload byte, a nonce byte, a tag byte, the key id */
    ASSERT_EQ_U64(put_range(t, plan, 4, 4), 4);
    static const size_t where[] = {KVO_REMOTE_HEADER_BYTES + 777, KVO__SEAL_NONCE_OFF + 5, KVO__SEAL_TAG_OFF + 15,
                                   KVO__SEAL_KEYID_OFF};
    for (int i = 0; i < 4; i++) {
        size_t len = 0;
        unsigned char *v = raw_get(t, port, 4 + (uint64_t)i, &len);
        ASSERT_EQ_U64(len, KVO_REMOTE_HEADER_BYTES + cb);
        v[where[i]] ^= 0x10;
        raw_set(t, port, 4 + (uint64_t)i, v, len);
        free(v);
    }
    ASSERT_EQ_U64(get_range(t, plan, 4, 4, res), 0);
    for (int i = 0; i < 4; i++) ASSERT_EQ_INT(res[i], KVO_ECORRUPT);
    kvo_remote_tier_stats s = stats(t);
    ASSERT_EQ_U64(s.auth_failed, 8);
    ASSERT_EQ_U64(s.corrupt_deleted, 0);
    /* a damaged header checksum is plain corruption: deleted as before */
    size_t len = 0;
    unsigned char *v = raw_get(other, port, 1, &len);
    v[40] ^= 1;
    raw_set(other, port, 1, v, len);
    free(v);
    ASSERT_EQ_U64(get_range(other, plan, 1, 1, res), 0);
    ASSERT_EQ_INT(res[0], KVO_ECORRUPT);
    ASSERT_EQ_U64(stats(other).corrupt_deleted, 1);
    ASSERT_EQ_U64(stats(other).auth_failed, 0);
    kvo_chunk_key k1 = ftf_key(1, 0);
    ASSERT_EQ_INT(exists_one(other, &k1), KVO_ENOTFOUND);
    free(forged);
    free(dst);
    kvo_remote_tier_destroy(plain);
    kvo_remote_tier_destroy(other);
    kvo_remote_tier_destroy(t);
    kvo_plan_destroy(plan);
}

/* The key name is authenticated: tenant A's sealed value copied under
 * tenant B's prefix (the same chunk key, fingerprint and secret) fails. */
KVO_TEST(value_moved_to_another_prefix_fails) {
    int port = shared_port();
    need_seal();
    kvo_plan *plan = make_plan();
    char pa[96], pb[96];
    snprintf(pa, sizeof pa, "%s", prefix("tenant-a"));
    snprintf(pb, sizeof pb, "%s", prefix("tenant-b"));
    kvo_remote_tier *a = open_sealed(port, plan, pa, S1, NULL), *b = open_sealed(port, plan, pb, S1, NULL);
    ASSERT_EQ_U64(put_range(a, plan, 0, 2), 2);
    ASSERT_EQ_U64(put_range(b, plan, 1, 1), 1); /* control: b's own value of key 1 loads */
    ASSERT_EQ_U64(get_range(b, plan, 1, 1, NULL), 1);
    size_t len = 0;
    unsigned char *v = raw_get(a, port, 0, &len);
    raw_set(b, port, 0, v, len);
    free(v);
    int res[1];
    ASSERT_EQ_U64(get_range(b, plan, 0, 1, res), 0);
    ASSERT_EQ_INT(res[0], KVO_ECORRUPT);
    ASSERT_EQ_U64(stats(b).auth_failed, 1);
    ASSERT_EQ_U64(get_range(a, plan, 0, 1, NULL), 1); /* the original is fine */
    kvo_remote_tier_destroy(a);
    kvo_remote_tier_destroy(b);
    kvo_plan_destroy(plan);
}

KVO_TEST(rotation_reads_the_previous_secret) {
    int port = shared_port();
    need_seal();
    kvo_plan *plan = make_plan();
    const char *pfx = prefix("seal-rot");
    kvo_remote_tier *old = open_sealed(port, plan, pfx, S1, NULL);
    ASSERT_EQ_U64(put_range(old, plan, 0, 4), 4);
    kvo_remote_tier *rotated = open_sealed(port, plan, pfx, S2, S1);
    ASSERT_EQ_U64(get_range(rotated, plan, 0, 4, NULL), 4); /* the old values still load */
    ASSERT_EQ_U64(put_range(rotated, plan, 10, 4), 4);      /* new ones, sealed with S2 */
    int res[4];
    ASSERT_EQ_U64(get_range(old, plan, 10, 4, res), 0);     /* an engine not yet rotated misses them */
    ASSERT_EQ_U64(stats(old).auth_failed, 4);
    kvo_remote_tier *done = open_sealed(port, plan, pfx, S2, NULL);
    ASSERT_EQ_U64(get_range(done, plan, 10, 4, NULL), 4);
    ASSERT_EQ_U64(get_range(done, plan, 0, 4, res), 0);     /* rotation over: the old values miss */
    kvo_remote_tier_destroy(old);
    kvo_remote_tier_destroy(rotated);
    kvo_remote_tier_destroy(done);
    kvo_plan_destroy(plan);
}

KVO_TEST(secret_from_the_environment) {
    int port = shared_port();
    need_seal();
    kvo_plan *plan = make_plan();
    const char *pfx = prefix("seal-env");
    ASSERT_EQ_INT(setenv("KVO_REMOTE_SECRET", S1, 1), 0);
    kvo_remote_tier *env = open_sealed(port, plan, pfx, NULL, NULL); /* params give none: the variable */
    ASSERT_EQ_U64(put_range(env, plan, 0, 2), 2);
    kvo_remote_tier *given = open_sealed(port, plan, pfx, S1, NULL);
    ASSERT_EQ_U64(get_range(given, plan, 0, 2, NULL), 2);
    kvo_remote_tier *none = open_sealed(port, plan, pfx, "", NULL); /* "": no secret, whatever the variable */
    int res[2];
    ASSERT_EQ_U64(get_range(none, plan, 0, 2, res), 0);
    ASSERT_EQ_U64(stats(none).auth_failed, 2);
    unsetenv("KVO_REMOTE_SECRET");
    kvo_remote_tier_destroy(env);
    kvo_remote_tier_destroy(given);
    kvo_remote_tier_destroy(none);
    kvo_plan_destroy(plan);
}

/* Gets and exists of keys whose sealed puts are held back are answered
 * from the puts' sealed staging bytes, opened into the destinations. */
KVO_TEST(reads_right_after_sealed_puts) {
    int port = shared_port();
    need_seal();
    kvo_plan *plan = make_plan();
    kvo_remote_tier *t = open_sealed(port, plan, prefix("seal-raw"), S1, NULL);
    uint64_t cb = chunk_bytes(plan);
    enum { N = 6 };
    kvo__remote_test_hold_puts(t, true);
    unsigned char *src = malloc(cb), *dsts = malloc(cb * N), *want = malloc(cb);
    for (int i = 0; i < N; i++) {
        kvo_chunk_key k = ftf_key((uint64_t)i, 0);
        ftf_fill(src, cb, &k);
        const void *s = src;
        int r = 1;
        ASSERT_OK(kvo_remote_tier_put(t, &k, &s, 1, NULL, &r, NULL));
        ASSERT_EQ_INT(r, 0);
    }
    for (int i = 0; i < N; i++) {
        kvo_chunk_key k = ftf_key((uint64_t)i, 0);
        void *d = dsts + (size_t)i * cb;
        uint64_t ud = (uint64_t)i;
        ASSERT_OK(kvo_remote_tier_get(t, &k, &d, 1, &ud, NULL, NULL));
    }
    ASSERT_EQ_U64(stats(t).reads_after_put, N);
    kvo__remote_test_hold_puts(t, false);
    for (size_t done = 0; done < N;) {
        ASSERT_OK(kvo_remote_tier_wait(t, KVO_MS(30000)));
        kvo_remote_completion c[N];
        size_t m = 0;
        ASSERT_OK(kvo_remote_tier_poll(t, c, N, &m));
        for (size_t j = 0; j < m; j++) {
            ASSERT_EQ_INT(c[j].result, 0);
            kvo_chunk_key k = ftf_key(c[j].user_data, 0);
            ftf_fill(want, cb, &k);
            ASSERT_MEM_EQ(dsts + c[j].user_data * cb, want, cb);
        }
        done += m;
    }
    ASSERT_EQ_U64(get_range(t, plan, 0, N, NULL), N); /* and from Redis */
    free(src);
    free(dsts);
    free(want);
    kvo_remote_tier_destroy(t);
    kvo_plan_destroy(plan);
}

/* Refused at create, before any connection (no cluster needed), and never
 * shown: a short secret, a short previous one, a previous one alone. */
KVO_TEST(bad_secrets_refused_without_showing_them) {
#if !KVO_HAVE_REDIS
    SKIP("built without hiredis");
#endif
    kvo_plan *plan = make_plan();
    kvo_remote_tier_params p = kvo_remote_tier_default_params();
    p.url = "redis://127.0.0.1:1";
    p.plan = plan;
    kvo_remote_tier *t = NULL;
    if (!kvo__seal_available()) {
        p.secret = S1;
        ASSERT_ERR(kvo_remote_tier_create(&p, &t), KVO_ENOTSUP);
        ASSERT_CONTAINS(kvo_last_error(), "OpenSSL");
        kvo_plan_destroy(plan);
        return;
    }
    const char *secrets[][2] = {{"Tiny-Secret-9", NULL}, {S1, "Tiny-Secret-9"}, {"", S1}};
    for (int i = 0; i < 3; i++) {
        p.secret = secrets[i][0];
        p.secret_previous = secrets[i][1];
        ASSERT_ERR(kvo_remote_tier_create(&p, &t), KVO_EINVAL);
        ASSERT_NULL(t);
        ASSERT_TRUE(strstr(kvo_last_error(), "Tiny-Secret") == NULL && strstr(kvo_last_error(), S1) == NULL);
    }
    ASSERT_EQ_INT(setenv("KVO_REMOTE_SECRET", "Tiny-Secret-9", 1), 0);
    p.secret = p.secret_previous = NULL;
    ASSERT_ERR(kvo_remote_tier_create(&p, &t), KVO_EINVAL);
    ASSERT_CONTAINS(kvo_last_error(), "KVO_REMOTE_SECRET");
    ASSERT_TRUE(strstr(kvo_last_error(), "Tiny-Secret") == NULL);
    unsetenv("KVO_REMOTE_SECRET");
    kvo_plan_destroy(plan);
}

/* The reader's path for a sealed value already whole in hiredis's buffer
 * (reply.c, mk_string): opened on its way into the sink; a flipped byte
 * fails (sink_seal_rc).  No cluster: bytes are fed to the reader. */
KVO_TEST(reader_opens_a_whole_sealed_value) {
#if !KVO_HAVE_REDIS
    SKIP("built without hiredis");
#else
    need_seal();
    enum { HDR = 4096, PAY = 150000 };
    kvo__seal *s = NULL;
    ASSERT_OK(kvo__seal_create(S1, NULL, "test", &s));
    kvo__seal_op *op = kvo__seal_op_take(s);
    size_t n = HDR + PAY;
    char *wire = malloc(n + 64), *hdr = malloc(HDR), *dst = malloc(PAY);
    unsigned char *plain = malloc(PAY);
    for (size_t i = 0; i < PAY; i++) plain[i] = (unsigned char)(i * 29 + 3);
    const char *name = "kvo:fp:0123-g0";
    for (int flip = 0; flip < 2; flip++) {
        int head = snprintf(wire, 64, "$%zu\r\n", n);
        unsigned char *h = (unsigned char *)wire + head;
        memset(h, 0, HDR);
        memset(h, 0x11, 264);
        ASSERT_OK(kvo__seal_value(op, h, name, strlen(name), h + HDR, plain, PAY));
        if (flip) h[HDR + 1234] ^= 0x80;
        memcpy(wire + head + n, "\r\n", 2);
        redisContext ctx;
        memset(&ctx, 0, sizeof ctx);
        ctx.reader = redisReaderCreate();
        kvo__rc_reader_setup(&ctx, n);
        kvo__rc_cmd cmd;
        memset(&cmd, 0, sizeof cmd);
        cmd.key = name;
        cmd.klen = strlen(name);
        cmd.sink_hdr = hdr;
        cmd.sink_dst = dst;
        cmd.sink_hdr_len = HDR;
        cmd.sink_len = PAY;
        cmd.sink_seal = op;
        cmd.sink_seal_rc = 12345;
        ctx.reader->privdata = &cmd;
        ASSERT_EQ_INT(redisReaderFeed(ctx.reader, wire, (size_t)head + n + 2), REDIS_OK);
        redisReply *r = NULL;
        ASSERT_EQ_INT(redisReaderGetReply(ctx.reader, (void **)&r), REDIS_OK);
        ASSERT_TRUE(r != NULL && r->str == NULL && r->len == n);
        if (flip) ASSERT_EQ_INT(cmd.sink_seal_rc, KVO_ECORRUPT);
        else {
            ASSERT_EQ_INT(cmd.sink_seal_rc, 0);
            ASSERT_MEM_EQ(dst, plain, PAY);
        }
        freeReplyObject(r);
        redisReaderFree(ctx.reader);
    }
    kvo__seal_op_give(s, op);
    kvo__seal_destroy(s);
    free(wire);
    free(hdr);
    free(dst);
    free(plain);
#endif
}
