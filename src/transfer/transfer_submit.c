/*
 * kvo_transfer_submit and its checks (see transfer.c's essay, "Ordering").
 * Phases: validation (ops against the plan and the layout held at entry,
 * ops sharing a slot, a load writing an engine block twice), building the
 * job (one allocation: job, ops, engine block ids, resources, edge storage,
 * a load's duplicate-write set, the slot check's records; the slot and
 * duplicate checks run on the built job; a retired job's memory is reused when large
 * enough, so a steady stream of like jobs allocates nothing),
 * queueing (reserve table room, admission checks under the lock), dependency
 * linking (transfer_queue.c) and release to the ready list.  Validation and
 * building run without the lock.
 */
#include <stdlib.h>

#include "transfer/transfer_internal.h"

/* Entry size of the duplicate-write set (key, used, padding). */
#define KVO__XDUP_ESZ 24

typedef struct kvo__xslotuse {
    uintptr_t slot;
    uint32_t group, first, end;
    size_t op;
} kvo__xslotuse;

static int kvo__xslotuse_cmp(const void *x, const void *y) {
    const kvo__xslotuse *a = x, *b = y;
    if (a->slot != b->slot) return a->slot < b->slot ? -1 : 1;
    if (a->first != b->first) return a->first < b->first ? -1 : 1;
    return a->op < b->op ? -1 : (a->op > b->op);
}

/* Ops sharing a slot must be of one group, and in a store cover disjoint
 * blocks (two workers would race on the same bytes).  O(n log n) in ops;
 * u: room for n records (in the job's allocation). */
static int kvo__xcheck_slots(kvo_transfer *t, kvo_xfer_dir dir, const kvo__xop *ops, size_t n, kvo__xslotuse *u) {
    if (n < 2) return 0;
    size_t m = 0;
    for (size_t i = 0; i < n; i++)
        if (ops[i].n_blocks)
            u[m++] = (kvo__xslotuse){(uintptr_t)ops[i].slot, ops[i].group, ops[i].first_block,
                                     ops[i].first_block + ops[i].n_blocks, i};
    qsort(u, m, sizeof *u, kvo__xslotuse_cmp);
    int rc = 0;
    for (size_t i = 1; i < m && !rc; i++) {
        if (u[i].slot != u[i - 1].slot) continue;
        if (u[i].group != u[i - 1].group)
            rc = kvo__error(KVO_EINVAL, "%s ops %zu and %zu: one slot %p for groups '%s' and '%s'",
                            dir == KVO_XFER_STORE ? "store" : "load", u[i - 1].op, u[i].op, (void *)u[i].slot,
                            kvo_plan_group(t->plan, u[i - 1].group)->name, kvo_plan_group(t->plan, u[i].group)->name);
        else if (dir == KVO_XFER_STORE && u[i].first < u[i - 1].end)
            rc = kvo__error(KVO_EINVAL,
                            "store ops %zu and %zu write chunk blocks [%u, %u) and [%u, %u) of the same slot %p: "
                            "the ranges overlap",
                            u[i - 1].op, u[i].op, u[i - 1].first, u[i - 1].end, u[i].first, u[i].end,
                            (void *)u[i].slot);
    }
    return rc;
}

/* Any engine block written twice in res?  A kvo__hmap set of (block, group)
 * pairs in scratch memory of the job's allocation (cap entries of 24 bytes,
 * cap a power of two >= 2 * writes): O(n), no allocation, no lock. */
static int kvo__xcheck_dup_writes(kvo_transfer *t, const kvo__xres *res, size_t n, void *scratch, size_t cap) {
    kvo__hmap set = {scratch, KVO__XDUP_ESZ, cap, 0};
    memset(scratch, 0, cap * KVO__XDUP_ESZ);
    int rc = 0;
    for (size_t r = 0; r < n && !rc; r++) {
        if (!res[r].write) continue;
        bool existed;
        kvo__hmap_insert(&set, res[r].a, res[r].b, &existed);
        if (existed)
            rc = kvo__error(KVO_EINVAL,
                            "load: engine block %llu of group '%s' is written twice in one job (two chunk "
                            "blocks cannot load into the same engine block)",
                            (unsigned long long)res[r].a, kvo_plan_group(t->plan, (size_t)res[r].b)->name);
    }
    return rc;
}

/* Validation, per op: the group exists and is offloaded, the blocks lie in
 * the chunk, the slot holds the chunk, the engine block ids exist in layout
 * L.  Counts blocks, work units and groups for the job. */
static int kvo__xvalidate_ops(kvo_transfer *t, const kvo__xlayout *L, kvo_xfer_dir dir, const kvo_xfer_op *ops,
                              size_t n, uint64_t *total_blocks, uint64_t *n_units, uint64_t *group_mask) {
    const char *dname = dir == KVO_XFER_STORE ? "store" : "load";
    for (size_t i = 0; i < n; i++) {
        const kvo_xfer_op *op = &ops[i];
        const kvo_group_plan *gp = op->group < kvo_plan_num_groups(t->plan) ? kvo_plan_group(t->plan, op->group)
                                                                           : NULL;
        if (!gp)
            return kvo__error(KVO_EINVAL, "%s op %zu: group id %u does not exist (the plan has %zu groups)", dname,
                              i, op->group, kvo_plan_num_groups(t->plan));
        if (!gp->offloaded)
            return kvo__error(KVO_EINVAL, "%s op %zu: group '%s' (id %u) is not offloaded", dname, i, gp->name,
                              op->group);
        const kvo__xgroup *G = &L->groups[op->group];
        if ((uint64_t)op->first_block + op->n_blocks > gp->blocks_per_chunk)
            return kvo__error(KVO_EINVAL,
                              "%s op %zu, group '%s': blocks [%u, %llu) are not within the chunk of %llu blocks",
                              dname, i, gp->name, op->first_block,
                              (unsigned long long)op->first_block + op->n_blocks,
                              (unsigned long long)gp->blocks_per_chunk);
        if (op->n_blocks == 0) continue;
        *group_mask |= UINT64_C(1) << op->group;
        if (!op->engine_blocks)
            return kvo__error(KVO_EINVAL, "%s op %zu, group '%s': engine_blocks is NULL for %u blocks", dname, i,
                              gp->name, op->n_blocks);
        uintptr_t slot_end;
        if (!op->slot || op->slot_bytes < gp->chunk_bytes ||
            __builtin_add_overflow((uintptr_t)op->slot, (uintptr_t)gp->chunk_bytes, &slot_end))
            return kvo__error(KVO_EINVAL,
                              "%s op %zu, group '%s': slot %p of %llu bytes cannot hold the chunk of %llu bytes "
                              "(the group's slot_bytes is %llu)",
                              dname, i, gp->name, op->slot, (unsigned long long)op->slot_bytes,
                              (unsigned long long)gp->chunk_bytes, (unsigned long long)gp->slot_bytes);
        for (uint32_t b = 0; b < op->n_blocks; b++)
            if (op->engine_blocks[b] >= G->num_blocks)
                return kvo__error(KVO_EINVAL,
                                  "%s op %zu, group '%s': engine block %llu (entry %u) is out of range: the layout "
                                  "has %llu blocks (ids 0..%llu)",
                                  dname, i, gp->name, (unsigned long long)op->engine_blocks[b], b,
                                  (unsigned long long)G->num_blocks, (unsigned long long)G->num_blocks - 1);
        *total_blocks += op->n_blocks;
        *n_units += kvo__xunits_per_seg(G, op->n_blocks) * G->n_segs;
    }
    return 0;
}

/* Building: one allocation holding the job, its ops, their engine block ids,
 * its resource list, its edge storage, (loads) the duplicate-write set's
 * table and the slot check's records; `spare` (a retired job's memory, or NULL) is reused when it is large
 * enough, else freed.  A load is then checked for engine blocks written twice
 * (other repeats are fine: linking is idempotent). */
static int kvo__xbuild_job(kvo_transfer *t, kvo__xlayout *L, kvo_xfer_dir dir, const kvo_xfer_op *ops, size_t n,
                           uint64_t total_blocks, uint64_t n_units, uint64_t group_mask, kvo__xjob *spare,
                           kvo__xjob **out) {
    size_t max_res = n + (size_t)total_blocks, n_res = 0;
    uint64_t cap_edges = (uint64_t)max_res * (1 + KVO__XREADERS);
    if (cap_edges > t->max_queued) cap_edges = t->max_queued;
    size_t dup_cap = 0;
    if (dir == KVO_XFER_LOAD)
        for (dup_cap = 16; dup_cap < 2 * total_blocks; dup_cap *= 2) {}
    size_t sz = sizeof(kvo__xjob) + sizeof(kvo__xop) * n + sizeof(uint64_t) * total_blocks +
                sizeof(kvo__xres) * max_res + sizeof(kvo__xedge) * cap_edges + KVO__XDUP_ESZ * dup_cap +
                (n > 1 ? sizeof(kvo__xslotuse) * n : 0);
    kvo__xjob *j = spare;
    if (j && j->alloc_bytes >= sz) {
        size_t have = j->alloc_bytes;
        memset(j, 0, sizeof *j);
        j->alloc_bytes = have;
    } else {
        kvo__free(spare);
        j = kvo__calloc(1, sz);
        if (!j)
            return kvo__error(KVO_ENOMEM, "kvo_transfer_submit: out of memory for a job of %zu ops, %llu blocks",
                              n, (unsigned long long)total_blocks);
        j->alloc_bytes = sz;
    }
    *out = j;
    j->ops = (kvo__xop *)(j + 1);
    uint64_t *blocks = (uint64_t *)(j->ops + n);
    j->res = (kvo__xres *)(blocks + total_blocks);
    j->edges = (kvo__xedge *)(j->res + max_res);
    j->cap_edges = (size_t)cap_edges;
    j->dir = dir;
    j->layout = L;
    j->group_mask = group_mask;
    j->n_ops = n;
    j->n_units = n_units;
    uint64_t unit = 0, bpos = 0;
    for (size_t i = 0; i < n; i++) {
        const kvo_xfer_op *op = &ops[i];
        kvo__xop *x = &j->ops[i];
        const kvo__xgroup *G = &L->groups[op->group];
        *x = (kvo__xop){.group = op->group, .first_block = op->first_block, .n_blocks = op->n_blocks,
                        .slot = op->slot, .blocks = blocks + bpos, .unit_start = unit};
        if (op->n_blocks == 0) continue;
        memcpy(blocks + bpos, op->engine_blocks, sizeof(uint64_t) * op->n_blocks);
        bpos += op->n_blocks;
        x->units_per_seg = kvo__xunits_per_seg(G, op->n_blocks);
        unit += x->units_per_seg * G->n_segs;
        j->res[n_res++] = (kvo__xres){(uint64_t)(uintptr_t)op->slot, KVO__XTAG_SLOT, dir == KVO_XFER_STORE};
        for (uint32_t b = 0; b < op->n_blocks; b++)
            j->res[n_res++] = (kvo__xres){op->engine_blocks[b], op->group, dir == KVO_XFER_LOAD};
    }
    assert(unit == n_units || t->dev->whole_jobs);
    j->n_res = n_res;
    unsigned char *dup_set = (unsigned char *)(j->edges + cap_edges);
    int rc = kvo__xcheck_slots(t, dir, j->ops, n, (kvo__xslotuse *)(dup_set + KVO__XDUP_ESZ * dup_cap));
    /* A load must not write one engine block twice (two workers would race). */
    if (!rc && dir == KVO_XFER_LOAD) rc = kvo__xcheck_dup_writes(t, j->res, n_res, dup_set, dup_cap);
    return rc;
}

/* Queueing, lock held: room in the table for j's resources and id, then
 * admission (open, under max_queued_jobs, j's groups' layout unchanged since
 * validation). */
static int kvo__xadmit(kvo_transfer *t, const kvo__xjob *j) {
    /* The unlinked job (kvo__xlink) may change while reserve drops the lock:
     * done when the room reserved covers what linking needs now. */
    for (size_t need = 0; need != kvo__xlink_need(t, j);) {
        need = kvo__xlink_need(t, j);
        if (kvo__xtab_reserve(t, need))
            return kvo__error(KVO_ENOMEM,
                              "kvo_transfer_submit: out of memory for the dependency table (%zu entries)",
                              t->tab.n + need);
    }
    if (t->closed) return kvo__error(KVO_ECLOSED, "kvo_transfer_submit: the transfer engine is closed");
    if (t->n_live + t->n_zombies + t->ring_count >= t->max_queued)
        /* Zombies count too: every possible predecessor of this job is live
         * or a zombie, so fewer than max_queued edges are ever needed. */
        return kvo__error(KVO_EAGAIN,
                          "kvo_transfer_submit: %zu jobs unfinished (%zu of them canceled but still ordered) and %zu "
                          "results unpolled reach max_queued_jobs %u: poll results or wait, then retry",
                          t->n_live + t->n_zombies, t->n_zombies, t->ring_count, t->max_queued);
    if (t->layout != j->layout && (kvo__xlayout_changed(j->layout, t->layout) & j->group_mask))
        return kvo__error(KVO_ESTATE, "kvo_transfer_submit: the layout of a group in this job changed during the "
                                      "submit; submit again");
    return 0;
}

/* The layout to validate against, referenced; lock taken and dropped. */
static int kvo__xhold_layout(kvo_transfer *t, kvo__xlayout **out, kvo__xjob **spare) {
    int rc = 0;
    pthread_mutex_lock(&t->mu);
    if (t->closed) rc = kvo__error(KVO_ECLOSED, "kvo_transfer_submit: the transfer engine is closed");
    else if (!t->layout)
        rc = kvo__error(KVO_ESTATE, "kvo_transfer_submit: no layout registered (call kvo_transfer_set_layout)");
    else {
        *out = t->layout;
        t->layout->refs++;
        *spare = kvo__xspare_take(t);
    }
    pthread_mutex_unlock(&t->mu);
    return rc;
}

int kvo_transfer_submit(kvo_transfer *t, kvo_xfer_dir dir, const kvo_xfer_op *ops, size_t n, uint64_t *job_id) {
    if (!t || !job_id || (n && !ops))
        return kvo__error(KVO_EINVAL, "kvo_transfer_submit: t, job_id and ops (when n > 0) must not be NULL");
    if (dir != KVO_XFER_STORE && dir != KVO_XFER_LOAD)
        return kvo__error(KVO_EINVAL, "kvo_transfer_submit: dir %d is neither KVO_XFER_STORE nor KVO_XFER_LOAD",
                          (int)dir);
    kvo__xgc gc = {0};
    kvo__xlayout *L = NULL;
    kvo__xjob *spare = NULL;
    int rc = kvo__xhold_layout(t, &L, &spare);
    if (rc) return rc;

    /* Validation and building, unlocked. */
    uint64_t total_blocks = 0, n_units = 0, group_mask = 0;
    kvo__xjob *j = NULL;
    rc = kvo__xvalidate_ops(t, L, dir, ops, n, &total_blocks, &n_units, &group_mask);
    if (t->dev->whole_jobs) n_units = total_blocks > 0; /* the device takes the job as one unit */
    if (!rc) rc = kvo__xbuild_job(t, L, dir, ops, n, total_blocks, n_units, group_mask, spare, &j);
    else kvo__free(spare);
    if (!rc && t->dev->job_submit) rc = t->dev->job_submit(t->dev_state, dir, &j->dev_token);

    /* Queueing. */
    pthread_mutex_lock(&t->mu);
    if (!rc) rc = kvo__xadmit(t, j);
    if (rc) {
        kvo__xgc_layout_unref(&gc, L);
        pthread_mutex_unlock(&t->mu);
        if (j && j->dev_token) t->dev->job_done(t->dev_state, j->dev_token);
        kvo__free(j);
        kvo__xgc_run(&gc);
        return rc;
    }
    j->id = t->next_id++;
    kvo__xlink(t, j);
    t->st.jobs_submitted++;
    *job_id = j->id;
    if (j->n_deps) {
        j->state = KVO__XJ_WAITING;
        t->st.dep_waits++;
    } else if (j->n_units == 0) {
        kvo__xpost(t, j, 0);
        kvo__xretire(t, j, 0, &gc);
    } else {
        j->state = KVO__XJ_READY;
        kvo__xready_push(t, j);
        pthread_cond_signal(&t->work_cv);
    }
    pthread_mutex_unlock(&t->mu);
    kvo__xgc_run(&gc);
    return 0;
}
