/*
 * The transfer engine's workers (see transfer.c's essay): each loops taking
 * one work unit at a time from the job at the head of the ready lists (loads
 * first), copies it with the lock dropped, and retires the job when its last
 * unit is done.  A unit is a run of blocks of one segment of one op, or one
 * part of a huge page, or, for a device that takes whole jobs (the CUDA
 * device: one batched copy or kernel launch per job), the whole job: every
 * block of every op and segment; consecutive pages whose engine addresses
 * are adjacent are merged into one copy, and a device with a prefetch hint
 * is asked to prefetch the next run's source while the current one copies.
 * Nothing here allocates.
 */
#include "transfer/transfer_internal.h"

/* Copy len bytes between a slot and engine memory in j's direction. */
static inline void kvo__xcopy(kvo_transfer *t, const kvo__xjob *j, void *wctx, unsigned char *slot, uintptr_t eng,
                              uint64_t len) {
    if (j->dir == KVO_XFER_STORE) t->dev->copy(wctx, j->dir, slot, (const void *)eng, len);
    else t->dev->copy(wctx, j->dir, (void *)eng, slot, len);
}

/* Copy blocks [b0, b1) of op's segment seg (slot side contiguous): runs of
 * pages adjacent in engine memory are one copy each, and a device with a
 * prefetch hint is asked to fetch the next run's source first.  Adds to
 * *bytes and *copies. */
static void kvo__xcopy_blocks(kvo_transfer *t, const kvo__xjob *j, void *wctx, const kvo__xop *op,
                              const kvo__xgroup *G, const kvo__xseg *seg, uint64_t b0, uint64_t b1, uint64_t *bytes,
                              uint64_t *copies) {
    unsigned char *slot = op->slot + G->blocks_per_chunk * seg->slot_prefix + (op->first_block + b0) * seg->page;
    uintptr_t run_eng = 0;
    unsigned char *run_slot = slot;
    uint64_t run_len = 0;
    for (uint64_t i = b0; i < b1; i++) {
        uintptr_t eng = seg->base + (uintptr_t)(op->blocks[i] * seg->stride);
        if (run_len && eng == run_eng + run_len) {
            run_len += seg->page;
            continue;
        }
        if (run_len) {
            /* Start fetching the next run's source while this one copies. */
            if (t->dev->prefetch)
                t->dev->prefetch(wctx, j->dir == KVO_XFER_STORE ? (const void *)eng
                                                                 : (const void *)(slot + (i - b0) * seg->page),
                                 seg->page);
            kvo__xcopy(t, j, wctx, run_slot, run_eng, run_len);
            (*copies)++;
            *bytes += run_len;
        }
        run_eng = eng;
        run_slot = slot + (i - b0) * seg->page;
        run_len = seg->page;
    }
    if (run_len) {
        kvo__xcopy(t, j, wctx, run_slot, run_eng, run_len);
        (*copies)++;
        *bytes += run_len;
    }
}

/* A device that takes whole jobs (device.h: whole_jobs): every block of
 * every op, segment by segment, then one unit_end. */
static int kvo__xrun_job(kvo_transfer *t, kvo__xjob *j, void *wctx, uint64_t *bytes, uint64_t *copies) {
    if (t->dev->unit_job) t->dev->unit_job(wctx, j->dev_token);
    for (size_t k = 0; k < j->n_ops; k++) {
        const kvo__xop *op = &j->ops[k];
        if (!op->n_blocks) continue;
        const kvo__xgroup *G = &j->layout->groups[op->group];
        for (uint32_t s = 0; s < G->n_segs; s++)
            kvo__xcopy_blocks(t, j, wctx, op, G, &j->layout->segs[G->first_seg + s], 0, op->n_blocks, bytes, copies);
    }
    return t->dev->unit_end(wctx);
}

static int kvo__xrun_unit(kvo_transfer *t, kvo__xjob *j, uint64_t u, void *wctx, uint64_t *bytes,
                          uint64_t *copies) {
    if (t->dev->whole_jobs) return kvo__xrun_job(t, j, wctx, bytes, copies);
    size_t lo = 0, hi = j->n_ops;
    while (hi - lo > 1) {
        size_t mid = lo + (hi - lo) / 2;
        if (j->ops[mid].unit_start <= u) lo = mid;
        else hi = mid;
    }
    const kvo__xop *op = &j->ops[lo];
    assert(u >= op->unit_start && op->units_per_seg > 0);
    const kvo__xgroup *G = &j->layout->groups[op->group];
    uint64_t r = u - op->unit_start;
    uint64_t s = r / op->units_per_seg, part = r % op->units_per_seg;
    assert(s < G->n_segs);
    const kvo__xseg *seg = &j->layout->segs[G->first_seg + s];
    if (t->dev->unit_job) t->dev->unit_job(wctx, j->dev_token);
    if (G->unit_parts > 1) {
        /* One part of one huge page. */
        uint64_t b = part / G->unit_parts, plen = kvo__xpart_bytes(seg->page, G->unit_parts);
        uint64_t off = (part % G->unit_parts) * plen, len = 0;
        if (off < seg->page) {
            len = seg->page - off < plen ? seg->page - off : plen;
            unsigned char *sl = op->slot + G->blocks_per_chunk * seg->slot_prefix +
                                (op->first_block + b) * seg->page + off;
            kvo__xcopy(t, j, wctx, sl, seg->base + (uintptr_t)(op->blocks[b] * seg->stride) + off, len);
        }
        *bytes = len;
        *copies = len != 0;
        return t->dev->unit_end(wctx);
    }
    uint64_t b0 = part * G->unit_blocks, b1 = b0 + G->unit_blocks;
    if (b1 > op->n_blocks) b1 = op->n_blocks;
    kvo__xcopy_blocks(t, j, wctx, op, G, seg, b0, b1, bytes, copies);
    return t->dev->unit_end(wctx);
}

void *kvo__xworker(void *arg) {
    kvo_transfer *t = ((kvo__xworker_arg *)arg)->t;
    uint32_t w = ((kvo__xworker_arg *)arg)->index;
    kvo__free(arg);
    void *wctx = t->wctx[w];
    kvo__xgc gc = {0};
    pthread_mutex_lock(&t->mu);
    while (!t->stop) {
        /* Loads first: a request waits for them; stores are background. */
        kvo__xjob *j = t->ready_head[KVO_XFER_LOAD] ? t->ready_head[KVO_XFER_LOAD] : t->ready_head[KVO_XFER_STORE];
        if (!j || t->claim_budget == 0) {
            pthread_cond_wait(&t->work_cv, &t->mu);
            continue;
        }
        if (t->claim_budget > 0) t->claim_budget--;
        uint64_t u = j->next_unit++;
        if (j->next_unit == j->n_units) kvo__xready_remove(t, j);
        if (!j->started) {
            j->started = true;
            j->state = KVO__XJ_RUNNING;
            j->t_start = kvo__now_ns();
        }
        /* Another worker may take the job's next unit meanwhile. */
        if (j->next_unit < j->n_units && t->n_threads > 1) pthread_cond_signal(&t->work_cv);
        pthread_mutex_unlock(&t->mu);
        uint64_t bytes = 0, copies = 0;
        int rc = kvo__xrun_unit(t, j, u, wctx, &bytes, &copies);
        pthread_mutex_lock(&t->mu);
        j->bytes += bytes;
        j->copies += copies;
        if (rc && !j->status) j->status = rc;
        if (++j->done_units == j->n_units) {
            kvo__xpost(t, j, j->status);
            kvo__xretire(t, j, j->status, &gc);
            if (gc.jobs || gc.n_layouts) {
                pthread_mutex_unlock(&t->mu);
                kvo__xgc_run(&gc);
                pthread_mutex_lock(&t->mu);
            }
        }
    }
    pthread_mutex_unlock(&t->mu);
    return NULL;
}
