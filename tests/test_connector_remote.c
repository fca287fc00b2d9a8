/*
 * The connector with a remote tier (Redis Cluster on loopback) behind the
 * host tier: loads through the connector byte-exact (remote -> host slot ->
 * engine), lookups that answer PENDING while presence queries run and the
 * local answer once the budget is spent, a corrupted value that fails the
 * load (never wrong bytes) and is a miss afterwards, SIGKILL of a master
 * during loads and stores (loads fail or shrink -> recompute, stores
 * dropped and counted, traffic resumes after the promotion), the whole
 * cluster down (host hits go on, lookups end), and the CLI: two processes
 * sharing the cluster, and the demo staying MATCH through a node kill.
 * Skipped without KVO_TEST_REDIS (tools/test.sh starts a cluster).
 */
#include <signal.h>
#include <sys/wait.h>
#include <time.h>

#include "connector/connector_internal.h"
#include "kvoffload/kvo_metrics.h"
#include "connector_sim.h"
#include "remote_test.h"

static kvo_plan *plan2(void) { return sim_two_group_plan("remote-two"); }

static kvo_remote_tier *rtier(int port, const kvo_plan *p, const char *pfx) {
    char url[128];
    snprintf(url, sizeof url, "redis://127.0.0.1:%d", port);
    kvo_remote_tier_params rp = kvo_remote_tier_default_params();
    rp.url = url;
    rp.plan = p;
    rp.key_prefix = pfx;
    rp.io_threads = 2;
    rp.connect_timeout_ms = 300;
    rp.io_timeout_ms = 1000;
    rp.down_backoff_ms = 200;
    kvo_remote_tier *t = NULL;
    ASSERT_OK(kvo_remote_tier_create(&rp, &t));
    return t;
}

static void make_conn(sim *s, kvo_plan *p, kvo_remote_tier *t, uint32_t budget_us) {
    kvo_connector_params cp = kvo_connector_default_params();
    cp.remote_tier = t;
    cp.verify_checksums = true;
    cp.remote_lookup_budget_us = budget_us;
    cp.remote_exists_ttl_ms = 200;
    sim_init(s, p, &cp, 512);
    s->keep_plan = true;
}

static void fill(uint32_t *t, size_t n, uint32_t salt) {
    for (size_t i = 0; i < n; i++) t[i] = (uint32_t)(i * 13 + salt * 7919) % 40009;
}

static void nap_ms(long ms) {
    struct timespec ts = {ms / 1000, (ms % 1000) * 1000000L};
    nanosleep(&ts, NULL);
}

/* Look up until the answer is not PENDING (polling in between, as an
 * engine does every step); returns how many PENDING answers came first. */
static int lookup_settled(sim *s, uint64_t id, kvo_lookup_result *lr, bool *remote_pending) {
    for (int i = 0; i < 20000; i++) {
        ASSERT_OK(kvo_connector_lookup(s->c, id, 0, lr));
        if (lr->status != KVO_HIT_PENDING) return i;
        if (lr->remote_pending && remote_pending) *remote_pending = true;
        (void)kvo_connector_poll(s->c, NULL, 0, &(size_t){0});
        nap_ms(1);
    }
    FAILF("request %llu: lookups still PENDING after 20000 tries", (unsigned long long)id);
}

static void check_blocks(sim *s, sim_req *r, uint64_t b) {
    for (size_t g = 0; g < s->ng; g++)
        for (uint64_t i = 0; i < b / 16 && i < r->tn[g]; i++)
            if (r->tab[g][i] != KVO_NO_BLOCK && !sim_block_ok(s, r, g, i))
                FAILF("group %zu block index %llu differs: wrong bytes loaded", g, (unsigned long long)i);
}

/* Add request id (the n tokens tok), look up until settled and, on a hit,
 * load it and wait.  Returns true with the completion on a hit (the blocks
 * are checked byte-exact when it succeeded; a failure must report
 * tokens_valid 0); false when there was none.  The request is aborted. */
static bool try_load(sim *s, uint64_t id, const uint32_t *tok, size_t n, kvo_lookup_result *lr, kvo_completion *cp,
                     bool *remote_pending) {
    sim_req r;
    sim_req_init(&r, id);
    sim_req_tokens(&r, tok, n);
    ASSERT_OK(kvo_connector_add_request(s->c, &(kvo_request_desc){.struct_size = sizeof(kvo_request_desc), .id = id, .tokens = tok, .n_tokens = n}));
    (void)lookup_settled(s, id, lr, remote_pending);
    bool hit = lr->status == KVO_HIT;
    if (hit) {
        uint64_t b = lr->tokens;
        ASSERT_EQ_U64(lr->tokens_host + lr->tokens_file + lr->tokens_remote, b);
        for (size_t g = 0; g < s->ng; g++) {
            const kvo_group_plan *gp = kvo_plan_group(s->plan, g);
            sim_table_len(s, &r, g, b / 16);
            uint64_t from = gp->kind == KVO_GROUP_SLIDING && b > gp->window ? (b - gp->window) / 16 * 16 : 0;
            for (uint64_t i = from / 16; i < b / 16; i++) r.tab[g][i] = sim_alloc(s, g);
        }
        kvo_block_table tb[SIM_MAXG];
        sim_tables(s, &r, tb);
        ASSERT_OK(kvo_connector_load(s->c, id, b, tb, s->ng));
        *cp = sim_wait_completion(s, id, KVO_COMPLETION_LOAD);
        if (cp->status == 0) {
            ASSERT_EQ_U64(cp->tokens_valid, b);
            check_blocks(s, &r, b);
        } else {
            ASSERT_EQ_U64(cp->tokens_valid, 0); /* nothing loaded counts */
        }
    }
    ASSERT_OK(kvo_connector_abort(s->c, id));
    sim_req_free(s, &r);
    return hit;
}

/* A plan, a tier on port, and engine A's connector, which stored a
 * 400-token prompt (tok, from salt) as request 1; the tier flushed. */
typedef struct fx {
    kvo_plan *p;
    kvo_remote_tier *t;
    uint32_t tok[400];
    sim a;
} fx;

static void fx_stored(fx *f, int port, const char *pfx, uint32_t salt) {
    f->p = plan2();
    f->t = rtier(port, f->p, pfx);
    fill(f->tok, 400, salt);
    make_conn(&f->a, f->p, f->t, 5000000); /* lookups wait for the answers (a loaded machine is slow) */
    sim_store_prompt(&f->a, 1, f->tok, 400);
    ASSERT_OK(kvo_remote_tier_flush(f->t, KVO_MS(30000)));
}

static kvo_connector_stats cstats(sim *s) {
    kvo_connector_stats st = KVO_CONNECTOR_STATS_INIT;
    ASSERT_OK(kvo_connector_get_stats(s->c, &st));
    return st;
}

/* Engine A stores; engine B (its own connector, empty host tier) loads
 * everything from the remote tier, byte-exact; a zero budget answers at
 * once and hits once the answers are in. */
KVO_TEST(loads_byte_exact) {
    fx f;
    fx_stored(&f, shared_port(), prefix("conn-exact"), 1);
    kvo_plan *p = f.p;
    kvo_remote_tier *t = f.t;
    const uint32_t *tok = f.tok;
    kvo_connector_stats st = cstats(&f.a);
    ASSERT_GT_U64(st.chunks_stored, 0);
    ASSERT_EQ_U64(st.remote_writes + st.remote_writes_dropped, st.chunks_stored);
    ASSERT_EQ_U64(st.remote_writes_dropped, 0);
    sim_destroy(&f.a);

    sim b;
    make_conn(&b, p, t, 5000000);
    kvo_lookup_result lr;
    kvo_completion cp;
    bool rpend = false;
    ASSERT_TRUE(try_load(&b, 2, tok, 400, &lr, &cp, &rpend));
    ASSERT_TRUE(rpend); /* the first answers were PENDING on presence queries */
    ASSERT_EQ_U64(lr.tokens, 384);
    ASSERT_EQ_U64(lr.tokens_remote, 384);
    ASSERT_EQ_U64(lr.tokens_host, 0);
    ASSERT_EQ_INT(cp.status, 0);
    st = cstats(&b);
    ASSERT_EQ_U64(st.tokens_loaded_remote, 384);
    ASSERT_EQ_U64(st.tokens_loaded_file, 0);
    ASSERT_GT_U64(st.remote_reads, 0);
    ASSERT_GT_U64(st.remote_read_bytes, 0);
    ASSERT_EQ_U64(st.remote_read_failures, 0);
    ASSERT_GT_U64(st.remote_lookups_pending, 0);
    ASSERT_EQ_U64(st.host.pending, 0);
    ASSERT_EQ_U64(st.host.pinned, 0);
    {   /* the remote figures are metrics series too */
        static char text[1 << 16];
        size_t len = 0;
        ASSERT_OK(kvo_connector_stats_format(b.c, KVO_STATS_PROMETHEUS, text, sizeof text, &len));
        char want[96];
        snprintf(want, sizeof want, "kvoffload_loaded_tokens_total{tier=\"remote\"} %llu",
                 (unsigned long long)st.tokens_loaded_remote);
        ASSERT_NOT_NULL(strstr(text, want));
        snprintf(want, sizeof want, "kvoffload_remote_reads_total %llu", (unsigned long long)st.remote_reads);
        ASSERT_NOT_NULL(strstr(text, want));
    }
    /* the chunks read are host chunks now: the next lookup hits host */
    ASSERT_TRUE(try_load(&b, 3, tok, 400, &lr, &cp, NULL));
    ASSERT_EQ_U64(lr.tokens_host, 384);
    ASSERT_EQ_INT(cp.status, 0);
    sim_destroy(&b);

    /* budget 0: the first lookup answers the local result at once */
    sim c;
    make_conn(&c, p, t, 0);
    ASSERT_OK(kvo_connector_add_request(c.c, &(kvo_request_desc){.struct_size = sizeof(kvo_request_desc), .id = 4, .tokens = tok, .n_tokens = 400}));
    ASSERT_OK(kvo_connector_lookup(c.c, 4, 0, &lr));
    ASSERT_TRUE(lr.status != KVO_HIT_PENDING);
    ASSERT_GT_U64(cstats(&c).remote_budget_expired, 0);
    ASSERT_OK(kvo_connector_abort(c.c, 4));
    /* the answers land meanwhile: a later lookup hits the remote tier */
    bool hit = false;
    for (int i = 0; i < 2000 && !hit; i++) {
        (void)kvo_connector_poll(c.c, NULL, 0, &(size_t){0});
        nap_ms(1);
        hit = try_load(&c, 5 + (uint64_t)i, tok, 400, &lr, &cp, NULL) && lr.tokens == 384;
    }
    ASSERT_TRUE(hit);
    ASSERT_EQ_INT(cp.status, 0);
    /* (earlier, shorter hits may have brought some chunks to host) */
    ASSERT_EQ_U64(lr.tokens_host + lr.tokens_remote, 384);
    ASSERT_GT_U64(cstats(&c).tokens_loaded_remote, 0);
    sim_destroy(&c);
    kvo_remote_tier_destroy(t);
    kvo_plan_destroy(p);
}

/* Presence queries still in flight when this engine stores their chunks
 * (a lookup that answered without waiting): their answers, "absent" when
 * Redis read the keys, land as present, so once the host tier has dropped
 * the chunks the next lookup reads them from the remote tier.  Taken as
 * they were, that lookup missed until the answers expired (a minute
 * here). */
KVO_TEST(answer_in_flight_during_own_put_lands_present) {
    int port = shared_port(); /* skips without a cluster, before anything is allocated */
    kvo_plan *p = plan2();
    kvo_remote_tier *t = rtier(port, p, prefix("conn-asked"));
    uint32_t tok[400];
    fill(tok, 400, 5);
    kvo_connector_params cp = kvo_connector_default_params();
    cp.remote_tier = t;
    cp.verify_checksums = true;
    cp.remote_lookup_budget_us = 0;  /* answer at once; the queries stay in flight */
    cp.remote_exists_ttl_ms = 60000;
    sim s;
    sim_init(&s, p, &cp, 512);
    s.keep_plan = true;
    kvo_lookup_result lr;
    ASSERT_OK(kvo_connector_add_request(s.c, &(kvo_request_desc){.struct_size = sizeof(kvo_request_desc), .id = 1, .tokens = tok, .n_tokens = 400}));
    ASSERT_OK(kvo_connector_lookup(s.c, 1, 0, &lr));
    ASSERT_TRUE(lr.status != KVO_HIT);
    ASSERT_OK(kvo_connector_abort(s.c, 1));
    ASSERT_GT_U64(cstats(&s).remote_exists, 0);
    sim_store_prompt(&s, 2, tok, 400);
    ASSERT_OK(kvo_remote_tier_flush(t, KVO_MS(30000)));
    for (int i = 0; i < 5000 && stats(t).pending_reads; i++) nap_ms(1);
    ASSERT_EQ_U64(stats(t).pending_reads, 0);
    (void)kvo_connector_poll(s.c, NULL, 0, &(size_t){0}); /* the answers land */
    /* (stats(t).exists_misses: the queries Redis answered before the puts) */
    kvo__conn_lock(s.c);
    ASSERT_OK(kvo_store_clear(s.c->store)); /* the host tier drops the chunks */
    kvo__conn_unlock(s.c);
    kvo_completion c;
    ASSERT_TRUE(try_load(&s, 3, tok, 400, &lr, &c, NULL));
    ASSERT_EQ_U64(lr.tokens_remote, 384);
    ASSERT_EQ_INT(c.status, 0);
    sim_destroy(&s);
    kvo_remote_tier_destroy(t);
    kvo_plan_destroy(p);
}

/* A value corrupted in the cluster: the load that reads it fails (the
 * engine recomputes, nothing counts as loaded), the tier deletes the value,
 * and the next lookup does not hit it. */
KVO_TEST(corrupt_value_fails_load) {
    int port = shared_port();
    fx f;
    fx_stored(&f, port, prefix("conn-corrupt"), 2);
    kvo_plan *p = f.p;
    kvo_remote_tier *t = f.t;
    const uint32_t *tok = f.tok;
    /* corrupt the payload of the group-0 chunk with the highest position */
    kvo_store_entry ents[128];
    uint64_t cur = 0;
    size_t n = 0;
    ASSERT_OK(kvo_store_scan(kvo_connector_store(f.a.c), &cur, ents, 128, &n));
    ASSERT_GT_U64(n, 0);
    sim_destroy(&f.a);
    kvo_chunk_key victim = ents[0].key;
    bool found = false;
    for (size_t i = 0; i < n; i++)
        if (ents[i].key.group == 0) {
            victim = ents[i].key;
            found = true;
            break;
        }
    ASSERT_TRUE(found);
    char name[160], args[400];
    ASSERT_OK(kvo_remote_tier_key_name(t, &victim, name, sizeof name));
    snprintf(args, sizeof args, "-c SETRANGE '%s' %u CORRUPTED", name, KVO_REMOTE_HEADER_BYTES + 100);
    ASSERT_EQ_INT(rcli(port, NULL, args, NULL), 0);

    sim b;
    make_conn(&b, p, t, 5000000);
    kvo_lookup_result lr;
    kvo_completion cp;
    ASSERT_TRUE(try_load(&b, 2, tok, 400, &lr, &cp, NULL));
    ASSERT_EQ_U64(lr.tokens_remote, 384);
    ASSERT_TRUE(cp.status != 0); /* try_load checked tokens_valid == 0 */
    kvo_connector_stats st = cstats(&b);
    ASSERT_GT_U64(st.remote_read_failures, 0);
    ASSERT_EQ_U64(st.tokens_loaded, 0);
    ASSERT_GT_U64(stats(t).corrupt_deleted, 0);
    /* afterwards: a miss for that chunk; whatever hits is byte-exact */
    if (try_load(&b, 3, tok, 400, &lr, &cp, NULL)) {
        ASSERT_LT_U64(lr.tokens, 384);
        ASSERT_EQ_INT(cp.status, 0);
    }
    ASSERT_EQ_U64(cstats(&b).host.pinned, 0);
    sim_destroy(&b);
    kvo_remote_tier_destroy(t);
    kvo_plan_destroy(p);
}

/* A layout change that alters group 0's slot format: group 0 is neither
 * put to nor looked up in a tier holding the first layout (group 1 still
 * is); going back to the first layout uses the remote values again. */
KVO_TEST(layout_change_follows_tier_format) {
    fx f;
    fx_stored(&f, shared_port(), prefix("conn-layout"), 3);
    kvo_connector_stats s0 = cstats(&f.a);
    ASSERT_EQ_U64(s0.remote_writes, s0.chunks_stored);
    sim_layout(&f.a, 1); /* group 0: K and V apart */
    uint32_t other[400];
    fill(other, 400, 4);
    sim_store_prompt(&f.a, 2, other, 400);
    ASSERT_OK(kvo_remote_tier_flush(f.t, KVO_MS(30000)));
    kvo_connector_stats s1 = cstats(&f.a);
    uint64_t stored = s1.chunks_stored - s0.chunks_stored, put = s1.remote_writes - s0.remote_writes;
    ASSERT_GT_U64(put, 0);        /* group 1 */
    ASSERT_LT_U64(put, stored);   /* not group 0 */
    ASSERT_EQ_U64(s1.remote_writes_dropped, 0);
    /* host forgets; the full group's chunks are not asked for remotely:
     * no hit */
    kvo_store_clear(kvo_connector_store(f.a.c));
    kvo_lookup_result lr;
    kvo_completion cp;
    ASSERT_TRUE(!try_load(&f.a, 3, f.tok, 400, &lr, &cp, NULL));
    ASSERT_EQ_U64(cstats(&f.a).remote_reads, 0);
    /* the first layout again: the values stored under it load byte-exact */
    sim_layout(&f.a, 0);
    kvo_store_clear(kvo_connector_store(f.a.c));
    ASSERT_TRUE(try_load(&f.a, 4, f.tok, 400, &lr, &cp, NULL));
    ASSERT_EQ_INT(cp.status, 0);
    ASSERT_EQ_U64(lr.tokens_remote, 384);
    sim_destroy(&f.a);
    kvo_remote_tier_destroy(f.t);
    kvo_plan_destroy(f.p);
}

static bool port_is_master(int port) {
    char *out = NULL;
    if (rcli(port, NULL, "role", &out) != 0 || !out) {
        free(out);
        return false;
    }
    bool m = strncmp(out, "master", 6) == 0;
    free(out);
    return m;
}

static void kill_port(int port) {
    char pidfile[700];
    snprintf(pidfile, sizeof pidfile, "%s/%d/redis.pid", priv_dir[n_priv - 1], port);
    char *pid = kvo_test_read_file(pidfile, NULL);
    ASSERT_NOT_NULL(pid);
    ASSERT_EQ_INT(kill((pid_t)atoi(pid), SIGKILL), 0);
    free(pid);
}

/* From a node's INFO replication: 1 when it is a master some replica of
 * which has not acknowledged its whole stream (a slave's offset below the
 * master's master_repl_offset), else 0 (caught up, or not a master). */
__attribute__((noinline)) static int replicas_behind(const char *info) {
    const char *m = strstr(info, "master_repl_offset:");
    if (!strstr(info, "role:master") || !m) return 0;
    long long want = atoll(m + 19);
    for (const char *sl = strstr(info, "slave"); sl; sl = strstr(sl + 5, "slave")) {
        const char *off = strstr(sl, "offset=");
        const char *eol = strchr(sl, '\n');
        if (off && (!eol || off < eol) && atoll(off + 7) < want) return 1;
    }
    return 0;
}

/* Wait until every master's replicas have acknowledged its whole
 * replication stream, bounded. */
static void wait_replicas(int base) {
    for (int n = 0; n < 6; n++) {
        bool caught_up = false;
        for (int spin = 0; spin < 3000 && !caught_up; spin++) {
            char *o = NULL;
            /* a node that does not answer is gone (its replica took over) */
            caught_up = rcli(base + n, NULL, "info replication", &o) != 0 || !o || !replicas_behind(o);
            free(o);
            if (!caught_up) nap_ms(5);
        }
        ASSERT_TRUE(caught_up);
    }
}

/* SIGKILL of a master while engine B loads and stores through the
 * connector: loads routed to it fail or shrink (recompute; never wrong
 * bytes: try_load checks every block), stores to it are dropped and
 * counted, and after the replica's promotion full remote hits resume. */
KVO_TEST(master_kill_during_traffic) {
    int base = private_cluster(70, NULL);
    kvo_plan *p = plan2();
    kvo_remote_tier *t = rtier(base, p, "kill");
    enum { NP = 6 };
    uint32_t tok[NP][400];
    sim a;
    make_conn(&a, p, t, 20000);
    for (int i = 0; i < NP; i++) {
        fill(tok[i], 400, 10 + (uint32_t)i);
        sim_store_prompt(&a, 1 + (uint64_t)i, tok[i], 400);
        ASSERT_OK(kvo_remote_tier_flush(t, KVO_MS(30000))); /* below max_pending_writes: nothing dropped */
    }
    ASSERT_EQ_U64(cstats(&a).remote_writes_dropped, 0);
    sim_destroy(&a);
    wait_replicas(base); /* replication is asynchronous: the replicas catch up first */
    int victim = -1;
    for (int n = 1; n < 6 && victim < 0; n++)
        if (port_is_master(base + n)) victim = base + n;
    ASSERT_TRUE(victim > 0);

    sim b;
    make_conn(&b, p, t, 200000);
    kill_port(victim);
    uint64_t id = 100, degraded = 0, full_rounds = 0, ok_loads = 0;
    uint32_t fresh[400];
    for (int round = 0; round < 600 && full_rounds < 2; round++) {
        kvo_lookup_result lr;
        kvo_completion cp;
        kvo_store_clear(kvo_connector_store(b.c)); /* every hit comes from the cluster */
        for (int i = 0; i < NP; i++) /* byte-exact, failed (tokens_valid 0) or a miss */
            ok_loads += try_load(&b, id++, tok[i], 400, &lr, &cp, NULL) && cp.status == 0;
        /* stores go on: a fresh prompt, then loaded back from the cluster
         * alone (a failover may lose writes the replica had not received,
         * so the recovery is judged on writes made after it) */
        fill(fresh, 400, 1000 + (uint32_t)round);
        sim_store_prompt(&b, id++, fresh, 400);
        ASSERT_OK(kvo_remote_tier_flush(t, KVO_MS(30000)));
        kvo_store_clear(kvo_connector_store(b.c));
        bool hit = try_load(&b, id++, fresh, 400, &lr, &cp, NULL);
        if (hit && cp.status == 0 && lr.tokens == 384 && lr.tokens_remote == 384)
            full_rounds++;
        else {
            degraded++;
            full_rounds = 0;
            nap_ms(100);
        }
    }
    ASSERT_EQ_U64(full_rounds, 2);  /* traffic resumed after the promotion */
    ASSERT_GT_U64(degraded, 0);     /* the outage was seen: misses or failed loads */
    ASSERT_GT_U64(ok_loads, 0);
    ASSERT_OK(kvo_remote_tier_flush(t, KVO_MS(30000)));
    kvo_remote_tier_stats rs = stats(t);
    kvo_connector_stats st = cstats(&b);
    ASSERT_GT_U64(rs.dropped_io + st.remote_writes_dropped, 0); /* stores to the dead master: counted */
    ASSERT_EQ_U64(st.host.pinned, 0);
    sim_destroy(&b);
    kvo_remote_tier_destroy(t);
    kvo_plan_destroy(p);
}

/* The whole cluster goes away: host hits are served as before, lookups of
 * chunks only the cluster might hold end (no hang; a miss), stores complete
 * in the host tier with the remote puts dropped and counted. */
KVO_TEST(cluster_down_serves_host) {
    int base = private_cluster(80, NULL);
    kvo_plan *p = plan2();
    kvo_remote_tier *t = rtier(base, p, "down");
    uint32_t t1[400], t2[400], t3[400];
    fill(t1, 400, 21);
    fill(t2, 400, 22);
    fill(t3, 400, 23);
    sim a;
    make_conn(&a, p, t, 50000);
    sim_store_prompt(&a, 1, t1, 400);
    ASSERT_OK(kvo_remote_tier_flush(t, KVO_MS(30000)));
    stop_private();
    kvo_lookup_result lr;
    kvo_completion cp;
    ASSERT_TRUE(try_load(&a, 2, t1, 400, &lr, &cp, NULL)); /* from host */
    ASSERT_EQ_U64(lr.tokens_host, 384);
    ASSERT_EQ_INT(cp.status, 0);
    /* never stored: only the cluster could hold it; lookups end in a miss */
    ASSERT_TRUE(!try_load(&a, 3, t2, 400, &lr, &cp, NULL));
    ASSERT_EQ_INT(lr.status, KVO_HIT_NONE);
    /* stores still complete (host); the puts are lost and counted */
    uint64_t before = cstats(&a).chunks_stored;
    sim_store_prompt(&a, 4, t3, 400);
    ASSERT_GT_U64(cstats(&a).chunks_stored, before);
    ASSERT_OK(kvo_remote_tier_flush(t, KVO_MS(30000)));
    ASSERT_GT_U64(stats(t).dropped_io + cstats(&a).remote_writes_dropped, 0);
    ASSERT_TRUE(try_load(&a, 5, t3, 400, &lr, &cp, NULL));
    ASSERT_EQ_INT(cp.status, 0);
    /* host forgets: remote-only data is a miss now, never a hang */
    kvo_store_clear(kvo_connector_store(a.c));
    ASSERT_TRUE(!try_load(&a, 6, t1, 400, &lr, &cp, NULL));
    sim_destroy(&a);
    kvo_remote_tier_destroy(t);
    kvo_plan_destroy(p);
}

/* remote_url and remote_key_prefix of a JSON config reach the tier's
 * params, remote_lookup_budget_us the connector's; the demo takes them
 * from --config (no cluster needed: its error names the seed). */
KVO_TEST(config_remote_fields) {
    const char *json = "{\"remote_url\": \"redis://127.0.0.1:1,127.0.0.1:2\", \"remote_key_prefix\": \"tenant-a\","
                       " \"remote_lookup_budget_us\": 5000}";
    kvo_config *cfg = NULL;
    ASSERT_OK(kvo_config_from_json(json, strlen(json), &cfg));
    kvo_remote_tier_params rp = kvo_remote_tier_default_params();
    ASSERT_OK(kvo_config_apply_remote_tier(cfg, &rp));
    ASSERT_EQ_STR(rp.url, "redis://127.0.0.1:1,127.0.0.1:2");
    ASSERT_EQ_STR(rp.key_prefix, "tenant-a");
    ASSERT_EQ_STR(kvo_config_remote_url(cfg), "redis://127.0.0.1:1,127.0.0.1:2");
    kvo_connector_params cp = kvo_connector_default_params();
    ASSERT_EQ_U64(cp.remote_lookup_budget_us, 20000);
    ASSERT_OK(kvo_config_apply_connector(cfg, &cp));
    ASSERT_EQ_U64(cp.remote_lookup_budget_us, 5000);
    kvo_config_destroy(cfg);
#if KVO_HAVE_REDIS
    /* the demo with that config tries those seeds (nothing listens there) */
    char path[600], cmd[1400], *out = NULL;
    snprintf(path, sizeof path, "%s/remote.json", kvo_test_tmpdir());
    FILE *f = fopen(path, "w");
    ASSERT_NOT_NULL(f);
    fputs(json, f);
    fclose(f);
    snprintf(cmd, sizeof cmd, "'%s' demo --config '%s' --requests 2 --quiet 2>&1", KVO_CLI_PATH, path);
    ASSERT_TRUE(kvo_test_run(cmd, &out) != 0);
    ASSERT_NOT_NULL(out);
    if (!strstr(out, "cannot connect to 127.0.0.1:")) FAILF("the demo did not try the configured seeds: %s", out);
    free(out);
#endif
}

/* The number after "key": in the text after "after" (0 when absent). */
static unsigned long long json_num(const char *s, const char *after, const char *key) {
    const char *o = after ? strstr(s, after) : s;
    const char *k = o ? strstr(o, key) : NULL;
    return k ? strtoull(k + strlen(key), NULL, 10) : 0;
}

/* noinline: gcc 12 -O3 otherwise warns (falsely) that the output may dangle */
__attribute__((noinline)) static char *run_cli(const char *args) {
    char cmd[1024], *out = NULL;
    snprintf(cmd, sizeof cmd, "'%s' %s 2>&1", KVO_CLI_PATH, args);
    int rc = kvo_test_run(cmd, &out);
    if (rc != 0) FAILF("kvoffload %s: exit %d: %s", args, rc, out ? out : "");
    return out;
}

/* Two processes: engine A stores the workload, engine B (another run of
 * the CLI, nothing in its host or file tier) loads it from the cluster. */
KVO_TEST(cli_two_processes) {
    int port = shared_port();
    char args[512];
    const char *pfx = prefix("cli2");
    char pbuf[96];
    snprintf(pbuf, sizeof pbuf, "%s", pfx);
    snprintf(args, sizeof args,
             "demo --remote redis://127.0.0.1:%d --remote-prefix %s --phase store --requests 6 --max-blocks 16 "
             "--file-mib 0 --json --quiet",
             port, pbuf);
    char *out = run_cli(args);
    ASSERT_NOT_NULL(strstr(out, "\"match\":true"));
    ASSERT_GT_U64(json_num(out, "\"remote\":{", "\"writes\":"), 0);
    ASSERT_EQ_U64(json_num(out, "\"offload\":{", "\"tokens_loaded_remote\":"), 0);
    free(out);
    snprintf(args, sizeof args,
             "demo --remote redis://127.0.0.1:%d --remote-prefix %s --phase load --requests 6 --max-blocks 16 "
             "--file-mib 0 --remote-budget-us 5000000 --json --quiet",
             port, pbuf);
    out = run_cli(args);
    ASSERT_NOT_NULL(strstr(out, "\"match\":true"));
    ASSERT_GT_U64(json_num(out, "\"offload\":{", "\"tokens_loaded_remote\":"), 0);
    ASSERT_GT_U64(json_num(out, "\"remote\":{", "\"reads\":"), 0);
    ASSERT_EQ_U64(json_num(out, "\"remote\":{", "\"read_failures\":"), 0);
    free(out);
}

/* Keys stored in the cluster now (DBSIZE summed over its six nodes'
 * masters). */
static unsigned long long cluster_keys(int base) {
    unsigned long long n = 0;
    for (int i = 0; i < 6; i++) {
        char *out = NULL;
        if (port_is_master(base + i) && rcli(base + i, NULL, "dbsize", &out) == 0 && out) n += strtoull(out, NULL, 10);
        free(out);
    }
    return n;
}

/* The demo stays MATCH when a master is killed while engine A stores and
 * run 2 loads. */
KVO_TEST(demo_match_through_node_kill) {
    int base = private_cluster(90, NULL);
    char cmd[1024], outp[600];
    snprintf(outp, sizeof outp, "%s/demo.json", kvo_test_tmpdir());
    snprintf(cmd, sizeof cmd,
             "'%s' demo --remote redis://127.0.0.1:%d --requests 16 --max-blocks 32 --file-mib 0 --json --quiet "
             "> '%s' 2>&1",
             KVO_CLI_PATH, base, outp);
    pid_t child = fork();
    ASSERT_TRUE(child >= 0);
    if (child == 0) {
        execl("/bin/sh", "sh", "-c", cmd, (char *)NULL);
        _exit(127);
    }
    /* kill a master once engine A has stored something */
    bool killed = false;
    int status = 0;
    for (int i = 0; i < 6000 && !killed; i++) {
        if (waitpid(child, &status, WNOHANG) == child) FAILF("the demo ended before any store reached the cluster");
        if (cluster_keys(base) > 0) {
            for (int n = 1; n < 6 && !killed; n++) /* not the seed node */
                if (port_is_master(base + n)) {
                    kill_port(base + n);
                    killed = true;
                }
        } else
            nap_ms(20);
    }
    ASSERT_TRUE(killed);
    ASSERT_EQ_INT(waitpid(child, &status, 0), child);
    char *out = kvo_test_read_file(outp, NULL);
    ASSERT_NOT_NULL(out);
    if (!WIFEXITED(status) || WEXITSTATUS(status) != 0) FAILF("demo failed (status %d): %s", status, out);
    ASSERT_NOT_NULL(strstr(out, "\"match\":true"));
    free(out);
}
