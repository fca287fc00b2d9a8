/* Remote tier faults, each on a private cluster (tools/redis-cluster.sh on
 * ports above KVO_TEST_REDIS's, loopback only, stopped at exit): a slot
 * migrated by hand (ASK, then MOVED), redis-cli --cluster reshard under
 * traffic, SIGKILL of a master during loads and stores, passwords and ACL
 * users, the whole cluster down.  Skipped without KVO_TEST_REDIS; every wait
 * is bounded; no test asserts a duration. */
#include "remote_test.h"

#include <pthread.h>
#include <stdatomic.h>

/* A slot migrated by hand: a new key of a MIGRATING slot goes to the
 * importing node through ASK + ASKING; after the migration the old owner
 * answers MOVED and the map follows. */
KVO_TEST(ask_moved) {
    int base = private_cluster(20, NULL);
    kvo_plan *plan = make_plan();
    kvo_remote_tier *t = open_tier(base, plan, "ask", NULL);
    ASSERT_EQ_U64(put_range(t, plan, 0, 1), 1);
    kvo_chunk_key k1 = ftf_key(0, 0);
    char n1[160];
    ASSERT_OK(kvo_remote_tier_key_name(t, &k1, n1, sizeof n1));
    uint32_t slot = kvo_remote_key_slot(n1, strlen(n1));
    int src = owner_port(t, base, &k1), dst = -1;
    for (int n = 0; n < 6 && dst < 0; n++)
        if (base + n != src && is_master(base + n)) dst = base + n;
    ASSERT_TRUE(dst > 0);
    char src_id[64], dst_id[64], args[512];
    node_id(src, src_id);
    node_id(dst, dst_id);
    snprintf(args, sizeof args, "cluster setslot %u importing %s", slot, src_id);
    ASSERT_EQ_INT(rcli(dst, NULL, args, NULL), 0);
    snprintf(args, sizeof args, "cluster setslot %u migrating %s", slot, dst_id);
    ASSERT_EQ_INT(rcli(src, NULL, args, NULL), 0);
    /* another key of the same slot, not stored yet */
    uint64_t i2 = 1;
    char n2[160];
    for (;; i2++) {
        kvo_chunk_key k = ftf_key(i2, 0);
        ASSERT_OK(kvo_remote_tier_key_name(t, &k, n2, sizeof n2));
        if (kvo_remote_key_slot(n2, strlen(n2)) == slot) break;
        ASSERT_LT_U64(i2, 10000000);
    }
    ASSERT_EQ_U64(put_range(t, plan, i2, 1), 1);
    ASSERT_EQ_U64(stats(t).puts, 2);
    ASSERT_GE_U64(stats(t).asked, 1);
    ASSERT_EQ_U64(get_range(t, plan, i2, 1, NULL), 1); /* ASK again: served by dst */
    ASSERT_EQ_U64(get_range(t, plan, 0, 1, NULL), 1);  /* still on src */
    char *o = NULL;
    /* finish the migration */
    snprintf(args, sizeof args, "migrate 127.0.0.1 %d \"\" 0 5000 keys %s", dst, n1);
    ASSERT_EQ_INT(rcli(src, NULL, args, &o), 0);
    free(o);
    for (int n = 0; n < 6; n++) {
        if (!is_master(base + n)) continue;
        snprintf(args, sizeof args, "cluster setslot %u node %s", slot, dst_id);
        rcli(base + n, NULL, args, NULL);
    }
    uint64_t moved0 = stats(t).moved;
    ASSERT_EQ_U64(get_range(t, plan, 0, 1, NULL), 1);
    ASSERT_EQ_U64(get_range(t, plan, i2, 1, NULL), 1);
    ASSERT_GT_U64(stats(t).moved, moved0);
    kvo_remote_tier_destroy(t);
    kvo_plan_destroy(plan);
}

/* redis-cli --cluster reshard moves 1000 slots while loads and stores run:
 * no wrong bytes ever, every stored key readable afterwards, redirections
 * followed. */
KVO_TEST(reshard_during_traffic) {
    int base = private_cluster(10, NULL);
    kvo_plan *plan = make_plan();
    kvo_remote_tier *t = open_tier(base, plan, "reshard", NULL);
    ASSERT_EQ_U64(put_range(t, plan, 0, 200), 200);
    int from = -1, to = -1;
    for (int n = 0; n < 6; n++)
        if (is_master(base + n)) {
            if (from < 0) from = base + n;
            else if (to < 0) to = base + n;
        }
    ASSERT_TRUE(from > 0 && to > 0);
    char from_id[64], to_id[64], cmd[1600], done[600];
    node_id(from, from_id);
    node_id(to, to_id);
    snprintf(done, sizeof done, "%s/reshard.done", kvo_test_tmpdir());
    snprintf(cmd, sizeof cmd, "(redis-cli --cluster reshard 127.0.0.1:%d --cluster-from %s --cluster-to %s "
             "--cluster-slots 1000 --cluster-yes --cluster-pipeline 10 > %s/reshard.log 2>&1; echo $? > %s) &",
             base, from_id, to_id, kvo_test_tmpdir(), done);
    ASSERT_EQ_INT(system(cmd), 0);
    int res[200];
    uint64_t round = 0, next_key = 1000;
    while (!file_exists(done)) {
        ASSERT_LT_U64(round++, 2000); /* bounded */
        get_range(t, plan, 0, 200, res);              /* wrong bytes fail inside */
        put_range(t, plan, next_key, 10);
        next_key += 10;
    }
    char *o = kvo_test_read_file(done, NULL);
    ASSERT_NOT_NULL(o);
    ASSERT_EQ_INT(atoi(o), 0);
    free(o);
    ASSERT_EQ_U64(get_range(t, plan, 0, 200, res), 200);
    kvo_remote_tier_stats s = stats(t);
    ASSERT_GT_U64(s.moved + s.asked, 0);
    ASSERT_EQ_U64(s.dropped_io, 0);
    /* stores made during the reshard are all there */
    ASSERT_EQ_U64(get_range(t, plan, 1000, (size_t)(next_key - 1000 > 200 ? 200 : next_key - 1000), NULL),
                  next_key - 1000 > 200 ? 200 : next_key - 1000);
    kvo_remote_tier_destroy(t);
    kvo_plan_destroy(plan);
}

/* Loads and stores from a second thread (no ASSERT there: it counts), so
 * that the kill happens while batches are in flight. */
typedef struct traffic {
    kvo_remote_tier *t;
    const kvo_plan *plan;
    atomic_bool stop;
    atomic_uint_fast64_t rounds, wrong, hits, misses, hung;
    uint64_t next_key;
} traffic;

static void *traffic_main(void *arg) {
    traffic *tr = arg;
    uint64_t cb = chunk_bytes(tr->plan);
    unsigned char *bufs = malloc(cb * 16), *want = malloc(cb);
    while (bufs && want && !atomic_load(&tr->stop)) {
        for (int i = 0; i < 8; i++) { /* stores of new keys; drops are fine */
            kvo_chunk_key k = ftf_key(tr->next_key++, 0);
            ftf_fill(want, cb, &k);
            const void *src = want;
            kvo_remote_tier_put(tr->t, &k, &src, 1, NULL, NULL, NULL);
        }
        kvo_chunk_key keys[16];
        void *dsts[16];
        uint64_t uds[16];
        size_t q = 0;
        uint64_t r0 = atomic_load(&tr->rounds);
        for (int i = 0; i < 16; i++) {
            keys[i] = ftf_key((r0 * 16 + (uint64_t)i) % 100, 0);
            dsts[i] = bufs + (uint64_t)i * cb;
            uds[i] = (uint64_t)i;
        }
        kvo_remote_tier_get(tr->t, keys, dsts, 16, uds, NULL, &q);
        for (size_t done = 0; done < q;) {
            if (kvo_remote_tier_wait(tr->t, KVO_MS(30000)) != 0) {
                atomic_fetch_add(&tr->hung, 1);
                break;
            }
            kvo_remote_completion c[16];
            size_t m = 0;
            ASSERT_OK(kvo_remote_tier_poll(tr->t, c, 16, &m));
            for (size_t j = 0; j < m; j++) {
                if (c[j].result != 0) {
                    atomic_fetch_add(&tr->misses, 1);
                    continue;
                }
                ftf_fill(want, cb, &keys[c[j].user_data]);
                if (memcmp(want, bufs + c[j].user_data * cb, cb) != 0) atomic_fetch_add(&tr->wrong, 1);
                else atomic_fetch_add(&tr->hits, 1);
            }
            done += m;
        }
        atomic_fetch_add(&tr->rounds, 1);
    }
    free(bufs);
    free(want);
    return NULL;
}

/* The replica of master `port` (its ROLE names the master's port). */
static int replica_of(int base, int port) {
    char want[16];
    snprintf(want, sizeof want, "\n%d\n", port);
    for (int n = 0; n < 6; n++) {
        char *o = NULL;
        rcli(base + n, NULL, "role", &o);
        bool yes = o && !strncmp(o, "slave", 5) && strstr(o, want);
        free(o);
        if (yes) return base + n;
    }
    FAILF("no replica of %d", port);
}

/* SIGKILL of a master while another thread loads and stores: loads are hits
 * with the right bytes or misses, never a hang; stores to the dead master are
 * dropped and counted; once its replica is promoted, traffic resumes. */
KVO_TEST(master_kill) {
    int base = private_cluster(30, NULL);
    kvo_plan *plan = make_plan();
    kvo_remote_tier *t = open_tier(base, plan, "kill", NULL);
    ASSERT_EQ_U64(put_range(t, plan, 0, 100), 100);
    int victim = -1;
    for (int n = 1; n < 6 && victim < 0; n++)
        if (is_master(base + n)) victim = base + n;
    ASSERT_TRUE(victim > 0);
    int heir = replica_of(base, victim);
    char pidfile[700];
    snprintf(pidfile, sizeof pidfile, "%s/%d/redis.pid", priv_dir[n_priv - 1], victim);
    char *pid = kvo_test_read_file(pidfile, NULL);
    ASSERT_NOT_NULL(pid);

    traffic tr;
    memset(&tr, 0, sizeof tr);
    tr.t = t;
    tr.plan = plan;
    tr.next_key = 1000;
    pthread_t th;
    ASSERT_EQ_INT(pthread_create(&th, NULL, traffic_main, &tr), 0);
    while (atomic_load(&tr.rounds) < 5) usleep(10000);
    ASSERT_EQ_INT(kill((pid_t)atoi(pid), SIGKILL), 0);
    free(pid);
    uint64_t rounds_at_kill = atomic_load(&tr.rounds);
    /* the replica takes over (node timeout 2 s + election): bounded wait */
    bool promoted = false;
    for (int i = 0; i < 600 && !promoted; i++) {
        promoted = is_master(heir);
        if (!promoted) usleep(100000);
    }
    ASSERT_TRUE(promoted);
    uint64_t rounds_outage = atomic_load(&tr.rounds) - rounds_at_kill;
    while (atomic_load(&tr.rounds) < rounds_at_kill + rounds_outage + 20) usleep(10000);
    atomic_store(&tr.stop, true);
    pthread_join(th, NULL);
    ASSERT_EQ_U64(atomic_load(&tr.wrong), 0);
    ASSERT_EQ_U64(atomic_load(&tr.hung), 0);
    ASSERT_GT_U64(rounds_outage, 0);           /* traffic went on while the master was dead */
    ASSERT_GT_U64(atomic_load(&tr.misses), 0); /* loads routed to it failed: misses */
    ASSERT_GT_U64(atomic_load(&tr.hits), 0);
    kvo_remote_tier_stats s = stats(t);
    ASSERT_GT_U64(s.dropped_io, 0);            /* stores to it were dropped and counted */
    ASSERT_GT_U64(s.node_failures, 0);
    /* every store lands and reads back again */
    uint64_t key = 100000;
    bool resumed = false;
    for (int round = 0; round < 600 && !resumed; round++) {
        uint64_t puts0 = stats(t).puts;
        put_range(t, plan, key, 30);
        resumed = stats(t).puts - puts0 == 30 && get_range(t, plan, key, 30, NULL) == 30;
        key += 30;
        if (!resumed) usleep(100000);
    }
    ASSERT_TRUE(resumed);
    ASSERT_GT_U64(stats(t).slot_refreshes, 1);
    int res[100];
    get_range(t, plan, 0, 100, res); /* what the replica had: never wrong bytes */
    kvo_remote_tier_destroy(t);
    kvo_plan_destroy(plan);
}

/* requirepass cluster: a wrong password is refused at create with a clear
 * message that does not contain it; the right one (url, env, ACL user)
 * works. */
KVO_TEST(wrong_password) {
    const char *pw = "kvo-Right-Pw-4711";
    int base = private_cluster(50, pw);
    kvo_plan *plan = make_plan();
    kvo_remote_tier_params p = kvo_remote_tier_default_params();
    char url[256];
    snprintf(url, sizeof url, "redis://:Wrong-Pw-0815@127.0.0.1:%d", base);
    p.url = url;
    p.plan = plan;
    p.key_prefix = prefix("auth");
    kvo_remote_tier *t = NULL;
    ASSERT_ERR(kvo_remote_tier_create(&p, &t), KVO_EIO);
    ASSERT_CONTAINS(kvo_last_error(), "authentication refused");
    ASSERT_TRUE(strstr(kvo_last_error(), "Wrong-Pw-0815") == NULL);
    ASSERT_NULL(t);
    /* no password at all: the server asks for one */
    snprintf(url, sizeof url, "redis://127.0.0.1:%d", base);
    unsetenv("KVO_REDIS_PASSWORD");
    ASSERT_ERR(kvo_remote_tier_create(&p, &t), KVO_EIO);
    ASSERT_CONTAINS(kvo_last_error(), "NOAUTH");
    /* from the environment */
    setenv("KVO_REDIS_PASSWORD", pw, 1);
    ASSERT_OK(kvo_remote_tier_create(&p, &t));
    unsetenv("KVO_REDIS_PASSWORD");
    ASSERT_EQ_U64(put_range(t, plan, 0, 8), 8);
    ASSERT_EQ_U64(stats(t).puts, 8);
    ASSERT_EQ_U64(get_range(t, plan, 0, 8, NULL), 8);
    kvo_remote_tier_destroy(t);
    /* an ACL user, in the url */
    for (int n = 0; n < 6; n++)
        ASSERT_EQ_INT(rcli(base + n, pw, "acl setuser kvouser on '>userpw' '~*' '+@all'", NULL), 0);
    t = open_tier(base, plan, "acl", "kvouser:userpw");
    ASSERT_EQ_U64(put_range(t, plan, 0, 4), 4);
    ASSERT_EQ_U64(get_range(t, plan, 0, 4, NULL), 4);
    kvo_remote_tier_destroy(t);
    snprintf(url, sizeof url, "redis://kvouser:nope@127.0.0.1:%d", base);
    ASSERT_ERR(kvo_remote_tier_create(&p, &t), KVO_EIO);
    ASSERT_CONTAINS(kvo_last_error(), "kvouser");
    kvo_plan_destroy(plan);
}

/* The whole cluster down: every call returns at once, loads complete with
 * KVO_EIO (a miss), stores are dropped and counted, nothing hangs; a new
 * tier is refused clearly. */
KVO_TEST(cluster_down) {
    int base = private_cluster(40, NULL);
    kvo_plan *plan = make_plan();
    kvo_remote_tier *t = open_tier(base, plan, "down", NULL);
    ASSERT_EQ_U64(put_range(t, plan, 0, 20), 20);
    stop_private();
    int res[20];
    ASSERT_EQ_U64(get_range(t, plan, 0, 20, res), 0);
    for (int i = 0; i < 20; i++) ASSERT_EQ_INT(res[i], KVO_EIO);
    ASSERT_EQ_U64(put_range(t, plan, 100, 20), 20); /* queued, then dropped */
    kvo_remote_tier_stats s = stats(t);
    ASSERT_EQ_U64(s.dropped_io, 20);
    ASSERT_EQ_U64(s.read_errors, 20);
    ASSERT_GT_U64(s.nodes_down, 0);
    kvo_chunk_key k = ftf_key(0, 0);
    ASSERT_EQ_INT(exists_one(t, &k), KVO_EIO);
    kvo_remote_tier_destroy(t); /* returns: nothing waits on the dead nodes */
    kvo_remote_tier_params p = kvo_remote_tier_default_params();
    char url[128];
    snprintf(url, sizeof url, "redis://127.0.0.1:%d,127.0.0.1:%d", base, base + 1);
    p.url = url;
    p.plan = plan;
    ASSERT_ERR(kvo_remote_tier_create(&p, &t), KVO_EIO);
    ASSERT_CONTAINS(kvo_last_error(), "cannot connect");
    kvo_plan_destroy(plan);
}


/* A master that stops answering (SIGSTOP: connections accepted, no replies):
 * its loads complete with KVO_EIO after io_timeout_ms instead of hanging,
 * the node goes into backoff, and once it answers again (SIGCONT) traffic
 * resumes. */
KVO_TEST(master_stopped) {
    int base = private_cluster(60, NULL);
    kvo_plan *plan = make_plan();
    kvo_remote_tier *t = open_tier(base, plan, "stop", NULL); /* io_timeout_ms 1000 */
    ASSERT_EQ_U64(put_range(t, plan, 0, 60), 60);
    int victim = -1;
    for (int n = 1; n < 6 && victim < 0; n++)
        if (is_master(base + n)) victim = base + n;
    ASSERT_TRUE(victim > 0);
    char pidfile[700];
    snprintf(pidfile, sizeof pidfile, "%s/%d/redis.pid", priv_dir[n_priv - 1], victim);
    char *pid = kvo_test_read_file(pidfile, NULL);
    ASSERT_NOT_NULL(pid);
    pid_t p = (pid_t)atoi(pid);
    free(pid);
    ASSERT_EQ_INT(kill(p, SIGSTOP), 0);
    int res[60];
    size_t hits = get_range(t, plan, 0, 60, res); /* bounded waits inside: no hang */
    ASSERT_EQ_INT(kill(p, SIGCONT), 0);
    size_t eio = 0;
    for (int i = 0; i < 60; i++) eio += res[i] == KVO_EIO;
    ASSERT_GT_U64(eio, 0);
    ASSERT_EQ_U64(hits + eio, 60);
    ASSERT_GT_U64(stats(t).node_failures, 0);
    bool resumed = false;
    for (int round = 0; round < 600 && !resumed; round++) {
        resumed = get_range(t, plan, 0, 60, NULL) == 60;
        if (!resumed) usleep(100000);
    }
    ASSERT_TRUE(resumed);
    kvo_remote_tier_destroy(t);
    kvo_plan_destroy(plan);
}
