/*
 * Branch eviction: protect the prefixes that requests branch from or come
 * back to.
 *
 * What it exploits: a prefix cache's keys form a tree (a chunk's key hashes
 * its parent's), and a request is a path from a root.  A key that has been
 * followed by two different children is a branch point: two requests shared
 * everything up to it and went on differently.  Such a prefix (a system
 * prompt, a document asked several questions, the shared turns of a forked
 * conversation) is the part of the tree that later requests share again; the
 * chunks past a request's last branch point are its own (a one-off
 * question's tail, the newest turn of a conversation) and are worth what
 * recency says.  A request whose first key was evicted and is still
 * remembered is a prefix coming back (a document asked again after a long
 * while): what of it was evicted is worth protecting too; so is a request
 * repeated whole, whose lookup ends at a known leaf (a key used before and
 * never followed).  The signals are structural: no hit counts to learn, no
 * sampling, no lag after a change of traffic (the prefix policy's
 * simulations need thousands of uses to choose; the ensemble's vote starts
 * with equal weights and loses its first evictions on chat traffic).
 *
 * How: each key has a 32-bit record: 24 bits of its first child's hash (0:
 * none seen), BRANCHED (a second, different child was seen), MARKED, SEEN
 * (used by a lookup or store before), GHOST, FROM_P and FROM_D (whose
 * victim), and its class, LEAF and CONT (below).  A stored key's record is
 * its entry's (ent.stamp); a key not in the store has its record in a table
 * of 2 records per entry the store can hold, 8-way set associative (a set
 * is one cache line of tag + record pairs, in recency order: a use moves a
 * record to the front, a new one replaces the set's last).  A victim's
 * record moves into the table as a GHOST; a stored key's record moves from
 * the table into its entry.  Each lookup and each store (the whole
 * request, in order; per group) uses every key's record and notes each
 * parent's child; then it marks every key up to the deepest branched
 * one; when the request's first key is a ghost, up to the deepest ghost if
 * that is deeper; when a lookup's last key is a known leaf, all of it.  Marks
 * last as long as the record.  Resident entries live in LRU lists: P
 * (marked at their last use), Q (the others) and D (unmarked keys of a dead
 * end class, below).  The victim is Q's oldest (D's first, below);
 * P's oldest only when Q is empty or under its floor, with a second chance
 * for each request that used it while in P (a count capped at 4, restarted
 * on entering P: S3-FIFO's main queue, so that the popular shared prefixes
 * outlive the ones a branch touched once).  A request is counted once however
 * many calls make it (its lookup, the loads of its hits, a touch, its store):
 * requests are epochs, the next one begun by any call after a store, and an
 * entry's use_tag holds the epoch of its last use (counting each call's use
 * instead cost 0.8-1.3 points on Mooncake through vLLM's manager, whose
 * request is a load and a store of the same hits).  Callers whose lookups go
 * one key at a time (vLLM's interface) set kvo_store_params.lookups_per_key:
 * this policy ignores such lookups (a one-key lookup of an evicted key would
 * read as a prefix coming back, and protect finished conversations: 38 %
 * fewer hits on conversations), and a store batch ending at a known leaf
 * counts as a repeat.  Q's floor is a share of the queued entries, 0
 * to 5 %, learnt from the victims that come back (stored again while the
 * table remembers them): up a step for one of Q's, down for one of P's, each
 * weighted by how much rarer its list's victims are (ARC's rule, victim
 * counts standing for ghost-list lengths).  Uses reach the policy deepest key
 * first (ops.leaf_first), so each list evicts a chain from its leaf end,
 * leaving a prefix that still hits.  Admission (ops.admit, with
 * kvo_store_params.policy_admission): an unmarked key is stored while the
 * batch's new keys fit in the free entries plus Q (or plus Q's floor when Q
 * is under it); past that its room would come from P with Q at its floor, so
 * it and its group's deeper keys are turned away: Q never grows past its
 * floor at P's expense, and a request used once keeps the prefix of it that
 * fits in Q's place.  Dead ends: each key stored gets a class from the
 * store that stores it, LEAF (its group's last key in the batch) and CONT
 * (the batch had a resident key of its group before it: the key continues a
 * prefix that hit), and the policy counts, per class, the keys stored and
 * their reuses (a request's use of one while unmarked, a return), halving
 * the counts every 4 x max_entries stores.  An unmarked key whose class has
 * at least 64 stores counted and under 1/8 of all classes' reuses per store
 * goes to a third list, D, whose oldest is the victim before Q's, while D's
 * victims come back no more often than Q's (victims and returns counted
 * per list, halved with the classes); before any victim of either has come
 * back, while an entry as old as D's oldest is no likelier to be used again
 * than one as old as Q's oldest, judged from the ages at which each list's
 * entries were used, were evicted or are still waiting (the estimate of
 * LHD, Beckmann et al., NSDI 2018: uses at that age or older over all
 * three).
 *
 * Why this design (docs/replay.md has the sweeps): on conversation traffic
 * nothing branches but shared system prompts, and a conversation's root is
 * resident while it goes on, so Q is LRU over everything else (never below
 * LRU on the generated chat traces, where LRU is the best of the three at
 * every capacity; marking every key used twice instead protects finished
 * conversations and loses up to 7 points there; a turn's lookup ends with
 * new chunks, never at a known leaf).  On document traffic the documents are
 * the branch points and the questions the one-off tails; on Mooncake both.
 * The floor is for traffic where nearly every re-used chunk is marked (on
 * Mooncake a prefix used again is nearly always followed by a new chunk): P
 * then takes no victim and grows over the cache, and late in the trace Q is
 * a chunk or two, losing the once-used requests that are repeated a few
 * hundred requests on; with the floor Mooncake is at or above the best of
 * three at 83 of 84 capacities (was 78).  It falls on small caches of
 * documents, whose P victims come back more often (36 % against Q's 15 % at
 * 2,600 blocks of a generated trace), and changes no hit on chat, where Q is
 * most of the cache.  Admission is for small caches of documents: P holds
 * nearly all of it, and a question's new document (a rarely asked one, or
 * its first time) took its room from the documents in P, displacing popular
 * ones for a document that is usually evicted from Q before it is asked
 * again; turned away, it costs nothing (an online LFU that evicts a new key's
 * own chunks first gains the same way).  It gains 0.4-1.2 points at 2 % of a
 * document trace's blocks and 0.1-0.7 at 5 %, changes no hit on chat (Q is
 * most of the cache), and on Mooncake is +0.003 points on the mean and -0.27
 * at 2,600 blocks (once-used requests that come back there).  A store in
 * front of a lower tier must not turn chunks away (the tier would never see
 * them), hence the parameter (off by default; the connector sets it when the
 * host tier is its last).  Records must outlive entries (a branch point or a
 * prefix coming back is seen when a later request returns, usually after its
 * first chunks were evicted): with no table, forgetting a record at
 * eviction, Mooncake falls below the best of three at 41 of 84 capacities
 * (by up to 4 points); more table suits Mooncake, less documents, whose
 * popular documents a long memory lets a rarely asked one crowd out: over
 * 9 table layouts (KVO_BRANCH_LAYOUT) and 33 traces, 1.75, 2, 2.25, 2.5
 * and 3 records per entry leave 58, 59, 78, 112 and 236 sweep capacities
 * below the best of three; 2 is kept (Mooncake's mean lead 0.05 points
 * smaller than at 2.5, the documents' larger).  Dead ends are for the
 * one-off tails: a document's question is stored after the document hit
 * (CONT | LEAF) and is never used again, and in Q it pushed out, in LRU
 * order, the documents asked once that would be asked again; evicted
 * first, it leaves them Q's room (0.5-1.3 points on generated document
 * traces at 20-50 % of their blocks, where ARC, S3-FIFO and this policy
 * without D were within a few hits of each other).
 * The classes are learnt, not assumed: on chat a turn's new chunks are
 * extended by the next turn (every class is reused, nothing is dead, the
 * same hits as without D); on Mooncake a leaf stored with no hit before it
 * is (2 % of them reused at 10,000 blocks, against 45 % of all keys).  D
 * stops giving victims when its victims come back more often than Q's
 * (Mooncake near a full cache, where late requests repeat once-used ones).
 * Near a full cache the first victims are chosen before any can come back,
 * and D first with no evidence lost the once-used requests repeated late
 * (Mooncake at 39,200-42,200 blocks: 1-23 hits below LRU, which evicts the
 * oldest of all); by age Q's oldest goes first at 39,200 (1 use among 65
 * of D's entries as old as its oldest, 0 among 64 of Q's), and no sweep
 * capacity of the 21 tuning traces is below the best of three (3 before;
 * over 9 table layouts 12, was 39).  After the first return the returns
 * decide: by age alone Q's old victims go first at 26,600-28,400 blocks
 * too, and come back (7 capacities below).  Cost: 3 record bits (the child
 * hash went from 27 bits to 24), a dozen counters and 2 KiB of age counts;
 * a store's classes are set in its pass over the keys, judging a class is
 * 4 terms, and the age rule (only while no victim has come back) sums
 * 4 x 64 counts and visits at most 2 x 64 entries.
 *
 * Invariants: a queued entry is READY, unpinned and in exactly one of P
 * (KVO__Q_T2), Q (KVO__Q_T1), D (KVO__Q_S), with at most BR_USES uses and
 * an age (requests since its last use) under 2^15 + 2^14; a
 * READY key's record is in its entry, never also in the table (a hash
 * collision in the table costs hit rate, never correctness: the lists hold
 * only resident entries); Q's floor is at most 5 %.  No ghosts (ghost_cap
 * 0): the history is the table.  Cost: a lookup or store is O(n) (its
 * resolution's entries, plus a set scan of 8 for each key not in the
 * store); insert, take and admit one set scan; hit and reinsert none;
 * take_victim O(1) amortized (each second chance was paid for by a use;
 * the age rule's sums and scans are bounded); a new request moves the age
 * hand over ceil(pool / 2^14) entries (one below 16,384 keys, 62 at a
 * million), so that no 16-bit age wraps (br_age_clamp).
 * Memory: 16 bytes of table per entry, 2 KiB of age counts per store.
 */
#include <string.h>

#include "store/store_internal.h"

#define BR_D KVO__Q_S  /* unmarked, of a dead-end class: evicted first */
#define BR_Q KVO__Q_T1 /* unmarked: evicted next */
#define BR_P KVO__Q_T2 /* marked: the shared prefixes */
#define BR_WAYS 8
#define BR_GHOSTS_X2 4 /* table records per two entries the store holds (2 per entry) */
/* Which bits of a key's mix choose its table set: 0 ships.  Another value
 * (0-8, -DKVO_BRANCH_LAYOUT=k at build time) gives the same policy with
 * other set collisions, whose sweeps show how much of a capacity's result
 * is layout luck (tools/branch_layouts.sh, docs/replay.md). */
#ifndef KVO_BRANCH_LAYOUT
#define KVO_BRANCH_LAYOUT 0
#endif
_Static_assert(KVO_BRANCH_LAYOUT >= 0 && KVO_BRANCH_LAYOUT <= 32, "KVO_BRANCH_LAYOUT: 0-32 (a 64-bit mix's 32 bits)");
#define BR_USES 4      /* second chances a P entry can earn */
/* Q's floor, a share of the queued entries in units of 1/BR_FLOOR_ONE: at
 * most BR_FLOOR_MAX (5 %), moved by BR_FLOOR_STEP (0.003 %) a return */
#define BR_FLOOR_ONE 100000
#define BR_FLOOR_MAX 5000
#define BR_FLOOR_STEP 3
/* Dead-end classes: a class's counts are halved every BR_CLS_WINDOW x
 * max_entries stores; a class is dead while it has BR_CLS_MIN stores counted
 * and its reuses per store are under 1/BR_CLS_DEAD of all classes' */
#define BR_CLS_WINDOW 4
#define BR_CLS_MIN 64
#define BR_CLS_DEAD 8
/* Ages (requests since an entry's last use, br_age_raw) in BR_AGES buckets, 4
 * an octave (br_age); at most BR_AGE_SCAN of a list's oldest entries are
 * visited to count those still waiting at its tail's age */
#define BR_AGES 64
#define BR_AGE_SCAN 64
/* Ages are 16-bit differences of epochs.  So that none wraps (an entry
 * unused for 2^16 requests would read as just used), a hand clamps the ages
 * of pool entries to BR_AGE_CAP as it passes them, visiting every entry
 * within BR_AGE_LAP requests: no age exceeds BR_AGE_CAP + BR_AGE_LAP - 1 < 2^16,
 * and every age under BR_AGE_CAP is exact (bucket 56 and above: "that old or
 * older"). */
#define BR_AGE_CAP 0x8000u
#define BR_AGE_LAP 0x4000u

/* A key's record, 32 bits: in its entry's stamp while the key is in the
 * store, else in the table with its tag. */
#define BR_CHILD 0x00FFFFFFu /* 24 bits of the first child's hash; 0: none seen */
#define BR_FROM_D (1u << 24) /* (in the table, with GHOST) the key was D's victim */
#define BR_LEAF (1u << 25)   /* class: the last key of its group in the store that stored it */
#define BR_CONT (1u << 26)   /* class: that store's batch had a resident key of its group before it */
#define BR_CLS (BR_LEAF | BR_CONT)
#define BR_FROM_P (1u << 27) /* (in the table, with GHOST) the key was P's victim */
#define BR_SEEN (1u << 28)   /* a lookup or store used the record before */
#define BR_GHOST (1u << 29)  /* (in the table) the key was evicted */
#define BR_BRANCHED (1u << 30)
#define BR_MARKED (1u << 31)

typedef struct br_slot {
    uint32_t tag; /* 32 bits of the key's hash, never 0; 0: an empty slot */
    uint32_t rec;
} br_slot;

struct kvo__branch {
    br_slot *tab; /* nsets * BR_WAYS slots, 64-byte aligned: a set is a cache line */
    void *base;
    uint64_t nsets;
    uint64_t floor;         /* Q's floor, in 1/BR_FLOOR_ONE of the queued entries */
    uint64_t from_q, from_p; /* victims taken from Q and from P */
    uint16_t epoch;          /* the request now in progress (br_observe), mod 2^16 */
    uint32_t age_hand;       /* the next pool entry whose age br_age_clamp caps */
    uint32_t age_step;       /* entries it passes per request: a lap in BR_AGE_LAP requests */
    bool stored;             /* the last call br_observe saw was a store */
    struct {                    /* dead-end classes (record bits LEAF, CONT) */
        uint64_t in[4];         /* keys of the class stored */
        uint64_t used[4];       /* their reuses: a request's use while unmarked, a return */
        uint64_t d_out, d_back; /* D's victims, and those of them that came back */
        uint64_t q_out, q_back; /* the same for Q's */
        uint64_t stores;        /* stores since the counts above were last halved */
        /* by age bucket (br_age), for D and Q (index br_aged): the uses of
         * their entries (a request's, as used above) and their victims */
        uint64_t age_used[2][BR_AGES], age_out[2][BR_AGES];
    } ends;
};

static inline uint32_t br_tag(uint64_t mix) { return (uint32_t)(mix >> 32) | 1u; }
static inline uint32_t br_child(uint64_t mix) { return (uint32_t)(mix >> 40) | 1u; }
static inline unsigned br_cls(uint32_t rec) { return (rec & BR_CLS) >> 25; }
/* List q's (BR_D or BR_Q) index in the age counts: D 0, Q 1. */
static inline unsigned br_aged(uint8_t q) { return q == BR_Q; }

/* Whether class c is a dead end: its reuses per store are under
 * 1/BR_CLS_DEAD of all classes' (doubles: the products of three counts can
 * pass 2^64). */
static bool br_dead(const kvo__branch *b, unsigned c) {
    if (b->ends.in[c] < BR_CLS_MIN) return false;
    double in = 0, used = 0;
    for (int k = 0; k < 4; k++) {
        in += (double)b->ends.in[k];
        used += (double)b->ends.used[k];
    }
    return (double)b->ends.used[c] * in * BR_CLS_DEAD < used * (double)b->ends.in[c];
}

/* A store of a key of class c: counted; every BR_CLS_WINDOW x max_entries
 * stores all counts are halved, so they follow the traffic. */
static void br_count_store(kvo_store *s, unsigned c) {
    kvo__branch *b = s->branch;
    b->ends.in[c]++;
    if (++b->ends.stores < BR_CLS_WINDOW * s->max_entries) return;
    b->ends.stores = 0;
    for (int k = 0; k < 4; k++) {
        b->ends.in[k] >>= 1;
        b->ends.used[k] >>= 1;
    }
    b->ends.d_out >>= 1;
    b->ends.d_back >>= 1;
    b->ends.q_out >>= 1;
    b->ends.q_back >>= 1;
    for (int l = 0; l < 2; l++)
        for (int a = 0; a < BR_AGES; a++) {
            b->ends.age_used[l][a] >>= 1;
            b->ends.age_out[l][a] >>= 1;
        }
}

/* Entry e's age, requests since its last use (exact under BR_AGE_CAP; at
 * most BR_AGE_CAP + BR_AGE_LAP - 1, br_age_clamp). */
static inline unsigned br_age_raw(const kvo_store *s, uint32_t e) {
    return (uint16_t)(s->branch->epoch - s->ent[e].use_tag);
}

unsigned kvo__branch_age(const kvo_store *s, uint32_t e) { return br_age_raw(s, e); }

/* At a new request: the next age_step pool entries' ages capped at
 * BR_AGE_CAP (any entry, queued or not: a free one's tag is rewritten when
 * it is next queued). */
static void br_age_clamp(kvo_store *s) {
    kvo__branch *b = s->branch;
    for (uint32_t i = 0; i < b->age_step; i++) {
        uint32_t e = b->age_hand;
        if (br_age_raw(s, e) > BR_AGE_CAP) s->ent[e].use_tag = (uint16_t)(b->epoch - BR_AGE_CAP);
        b->age_hand = e + 1 < s->pool_cap ? e + 1 : 0;
    }
}

/* Entry e's age as a bucket: 0-3 exact, then four an octave (at most 59). */
static inline unsigned br_age(const kvo_store *s, uint32_t e) {
    unsigned a = br_age_raw(s, e);
    if (a < 4) return a;
    unsigned l = 31u - (unsigned)__builtin_clz(a);
    return 4u * (l - 1u) + ((a >> (l - 2u)) & 3u);
}

static inline br_slot *br_set(const kvo__branch *b, uint64_t mix) {
    return b->tab + BR_WAYS * ((((mix >> KVO_BRANCH_LAYOUT) & UINT32_MAX) * b->nsets) >> 32);
}

static inline int br_find(const br_slot *set, uint32_t tag) {
    for (int i = 0; i < BR_WAYS; i++)
        if (set[i].tag == tag) return i;
    return -1;
}

/* The table's slot of the key (mix: its kvo__key_mix), or NULL. */
static inline br_slot *br_lookup(const kvo__branch *b, uint64_t mix) {
    br_slot *set = br_set(b, mix);
    int i = br_find(set, br_tag(mix));
    return i < 0 ? NULL : &set[i];
}

/* The table's record of the key, moved to its set's front (most recent); a
 * new, empty one there in place of the set's oldest when the key has none.
 * Returns the record. */
static uint32_t *br_use(kvo__branch *b, uint64_t mix) {
    br_slot *set = br_set(b, mix);
    br_slot r = {br_tag(mix), 0};
    int i = br_find(set, r.tag);
    if (i >= 0) r = set[i];
    else i = BR_WAYS - 1;
    memmove(set + 1, set, (size_t)i * sizeof *set);
    set[0] = r;
    return &set[0].rec;
}

/* The table's record of the key taken out of the table: *rec set, true; or
 * false when the table has none. */
static bool br_take_record(kvo__branch *b, uint64_t mix, uint32_t *rec) {
    br_slot *set = br_set(b, mix), *x = br_lookup(b, mix);
    if (!x) return false;
    *rec = x->rec;
    memmove(x, x + 1, (size_t)(set + BR_WAYS - 1 - x) * sizeof *set);
    set[BR_WAYS - 1] = (br_slot){0, 0};
    return true;
}

/* A use of e (not queued) that was in list `was` (0: none, a store): into
 * P or Q by its mark (a store of a dead-end class unmarked: D); its use
 * count grows in P, once a request (a load, a touch and a store of one
 * request are one use: the count is of requests, however many calls the
 * caller makes for one), and restarts outside it; a use of an unmarked
 * entry counts for its class, once a request. */
static void br_queue(kvo_store *s, uint32_t e, uint8_t was, bool dead) {
    kvo__entry *x = &s->ent[e];
    uint16_t epoch = s->branch->epoch;
    if ((was == BR_Q || was == BR_D) && x->use_tag != epoch) {
        s->branch->ends.used[br_cls(x->stamp)]++;
        s->branch->ends.age_used[br_aged(was)][br_age(s, e)]++;
    }
    uint8_t q = x->stamp & BR_MARKED ? BR_P : dead ? BR_D : BR_Q;
    x->freq = (uint8_t)(was != BR_P ? 0 : x->freq >= BR_USES || x->use_tag == epoch ? x->freq : x->freq + 1u);
    x->use_tag = epoch;
    kvo__list_push_head(s, &s->q[q], e, q);
}

/* A stored key's record moves from the table into its entry. */
static void br_insert(kvo_store *s, uint32_t e) {
    kvo__entry *x = &s->ent[e];
    kvo__branch *b = s->branch;
    uint32_t rec = 0;
    br_take_record(b, kvo__key_mix(&x->key), &rec);
    /* a victim coming back (stored again while the table remembers it):
     * Q's floor rises when it was Q's, falls when it was P's, each return
     * weighted by how much rarer its list's victims are (ARC's rule, victim
     * counts for ghost-list lengths), so the floor settles where the
     * victims of both lists come back as often */
    if (rec & BR_GHOST) {
        bool p = rec & BR_FROM_P;
        if (rec & BR_FROM_D) b->ends.d_back++;
        else if (!p) b->ends.q_back++;
        b->floor = kvo__adapt(b->floor, !p, p ? b->from_p : b->from_q, p ? b->from_q : b->from_p, BR_FLOOR_STEP,
                              BR_FLOOR_MAX);
    }
    x->stamp = rec & ~(BR_GHOST | BR_FROM_P | BR_FROM_D);
    x->ghost_q = 0;
    unsigned c = br_cls(x->stamp);
    br_count_store(s, c);
    br_queue(s, e, 0, br_dead(b, c));
}

static void br_remove(kvo_store *s, uint32_t e) {
    uint8_t q = s->ent[e].q;
    kvo__list_unlink(s, &s->q[q], e);
    s->ent[e].ghost_q = q; /* for untake (a reclaimed victim put back) and reinsert */
}

static void br_reinsert(kvo_store *s, uint32_t e) {
    uint8_t was = s->ent[e].ghost_q;
    s->ent[e].ghost_q = 0;
    br_queue(s, e, was, false);
}

static void br_hit(kvo_store *s, uint32_t e) {
    uint8_t was = s->ent[e].q;
    kvo__list_unlink(s, &s->q[was], e);
    br_queue(s, e, was, false);
}

/* How likely list q's (BR_D or BR_Q) entries as old as its oldest, t, are to
 * be used again, as *num / *den: the uses of its entries at that age bucket
 * or older, over those uses, its victims that old, and its entries still
 * waiting that old (counted from t towards the head, which is younger, up to
 * BR_AGE_SCAN: without them no victim has been counted when a cache first
 * fills, and every list's chance would read 1). */
static void br_tail_chance(const kvo_store *s, uint8_t q, uint32_t t, double *num, double *den) {
    const kvo__branch *b = s->branch;
    unsigned a = br_age(s, t), l = br_aged(q);
    uint64_t used = 0, out = 0, waiting = 0;
    for (unsigned k = a; k < BR_AGES; k++) {
        used += b->ends.age_used[l][k];
        out += b->ends.age_out[l][k];
    }
    for (uint32_t x = t; x != KVO__NIL && waiting < BR_AGE_SCAN && br_age(s, x) >= a; x = s->ent[x].prev) waiting++;
    *num = (double)used;
    *den = (double)(used + out + waiting);
}

/* Whether D's oldest (d) is the victim before Q's (q): while D's victims come
 * back no more often than Q's; while no return of either is counted (a cache
 * that has just filled, or whose victims are not asked again: the counts are
 * halved with the classes, so a return long ago no longer counts), while
 * an entry as old as d is no likelier to be used again than one as old as q
 * (br_tail_chance; ties to D). */
static bool br_d_first(const kvo_store *s, uint32_t d, uint32_t q) {
    const kvo__branch *b = s->branch;
    const uint64_t d_back = b->ends.d_back, d_out = b->ends.d_out, q_back = b->ends.q_back, q_out = b->ends.q_out;
    if (d_back + q_back) return d_back * (q_out + 1) <= q_back * (d_out + 1);
    double dn, dd, qn, qd;
    br_tail_chance(s, BR_D, d, &dn, &dd);
    br_tail_chance(s, BR_Q, q, &qn, &qd);
    return dn * qd <= qn * dd;
}

/* The victim's record goes to the table as its set's newest ghost: at take,
 * not at evicted, which prepare_store skips when it hands a victim's entry
 * to a new key (one slot size, no ghosts: store_prepare.c, KVO__HO_ENTRY);
 * untake takes it back out. */
static uint32_t br_take(kvo_store *s) {
    kvo__branch *b = s->branch;
    kvo__list *D = &s->q[BR_D], *Q = &s->q[BR_Q], *P = &s->q[BR_P];
    uint32_t e = Q->tail, from = 0;
    if (D->tail != KVO__NIL && (e == KVO__NIL || br_d_first(s, D->tail, e))) {
        e = D->tail;
        from = BR_FROM_D;
    } else if (e != KVO__NIL && P->tail != KVO__NIL && Q->n * BR_FLOOR_ONE < (Q->n + P->n) * b->floor) {
        e = KVO__NIL; /* Q under its floor: P gives the victim */
    }
    if (e == KVO__NIL) {
        while ((e = P->tail) != KVO__NIL && s->ent[e].freq > 0) {
            s->ent[e].freq--;
            kvo__list_unlink(s, P, e);
            kvo__list_push_head(s, P, e, BR_P);
        }
        from = BR_FROM_P;
    }
    if (e != KVO__NIL) {
        if (from != BR_FROM_P) b->ends.age_out[br_aged(s->ent[e].q)][br_age(s, e)]++;
        br_remove(s, e);
        *br_use(b, kvo__key_mix(&s->ent[e].key)) = s->ent[e].stamp | BR_GHOST | from;
        if (from == BR_FROM_P) {
            b->from_p++;
        } else { /* D's victims count as Q's for the floor */
            b->from_q++;
            if (from == BR_FROM_D) b->ends.d_out++;
            else b->ends.q_out++;
        }
    }
    return e;
}

static void br_untake(kvo_store *s, uint32_t e) {
    kvo__branch *b = s->branch;
    uint32_t rec;
    br_take_record(b, kvo__key_mix(&s->ent[e].key), &rec);
    uint8_t was = s->ent[e].ghost_q;
    uint64_t *n = was == BR_P ? &b->from_p : &b->from_q;
    if (*n) --*n;
    if (was == BR_D || was == BR_Q) { /* its list's victim counts, by list and by age */
        uint64_t *out = was == BR_D ? &b->ends.d_out : &b->ends.q_out;
        uint64_t *aged = &b->ends.age_out[br_aged(was)][br_age(s, e)];
        if (*out) --*out;
        if (*aged) --*aged;
    }
    kvo__untake_to_origin(s, e);
}

static void br_evicted(kvo_store *s, uint32_t e) {
    s->ent[e].ghost_q = 0;
    kvo__ghost_drop(s, e);
}

static void br_ghost_claim(kvo_store *s, uint32_t e) { (void)s; (void)e; }

/* Key j's record (mix: its kvo__key_mix) for a lookup or a store: its
 * entry's, when the key is READY in the store, found by the call's own
 * resolution (the lookup's memo or prepare_store's sc_ent), else the
 * table's (use: moved to the front or created; else NULL when absent).
 * *ghost: the table's record says evicted. */
static uint32_t *br_rec(kvo_store *s, int call, const kvo_chunk_key *keys, size_t n, size_t j, uint64_t mix,
                        bool use, bool *ghost) {
    uint32_t e = call == KVO__CALL_STORE ? s->sc_ent[j]
               : s->memo_n == n ? s->memo[j] : kvo__index_find_h(s, &keys[j], mix);
    *ghost = false;
    if (kvo__entry_ready(s, e)) return &s->ent[e].stamp;
    if (use) {
        uint32_t *r = br_use(s->branch, mix);
        *ghost = *r & BR_GHOST;
        return r;
    }
    br_slot *x = br_lookup(s->branch, mix);
    return x ? &x->rec : NULL;
}

/* A lookup's or store's keys, per group in order: each key's record used
 * and its parent's child noted; then each key up to the group's deepest
 * branched one marked; when the group's first key was evicted and is
 * remembered (a ghost: a prefix coming back), up to its deepest ghost if
 * that is deeper; when a lookup's last key of the group is a known leaf (a
 * repeat), all of them.  A clear forgets everything. */
static void br_observe(kvo_store *s, int call, const kvo_chunk_key *keys, size_t n) {
    kvo__branch *b = s->branch;
    if (call == KVO__CALL_CLEAR) {
        memset(b->tab, 0, (size_t)(b->nsets * BR_WAYS * sizeof *b->tab));
        b->floor = b->from_q = b->from_p = 0;
        memset(&b->ends, 0, sizeof b->ends);
        return;
    }
    /* one-key lookups (kvo_store_params.lookups_per_key) name no request */
    if (call == KVO__CALL_LOOKUP && s->params.lookups_per_key) return;
    /* request epochs: any call after a store begins the next request (a
     * request's lookup, loads and touches come before its store; a store
     * after a store is another request's, or a later step of the same one,
     * whose batch holds only new keys) */
    if (call != KVO__CALL_LOOKUP && call != KVO__CALL_STORE && call != KVO__CALL_TOUCH) return;
    if (b->stored) {
        b->epoch++;
        br_age_clamp(s);
    }
    b->stored = call == KVO__CALL_STORE;
    if (call == KVO__CALL_TOUCH) return;
    uint64_t seen = 0, mark = 0, ghost_root = 0, cont = 0; /* cont, bit g: a resident key of group g so far */
    uint64_t prev_mix[KVO_MAX_GROUPS], again = 0; /* again, bit g: group g's last key so far was used before */
    size_t prev[KVO_MAX_GROUPS], deepest[KVO_MAX_GROUPS], ghost_at[KVO_MAX_GROUPS];
    bool ghost;
    for (size_t j = 0; j < n; j++) {
        uint32_t g = keys[j].group;
        uint64_t bit = UINT64_C(1) << g, mix = kvo__key_mix(&keys[j]);
        uint32_t *r = seen & bit ? br_rec(s, call, keys, n, prev[g], prev_mix[g], false, &ghost) : NULL;
        if (r) { /* the parent, before the child's use can move it in the table */
            uint32_t c = br_child(mix), had = *r & BR_CHILD;
            if (!had) *r |= c;
            else if (had != c) *r |= BR_BRANCHED;
            if (*r & BR_BRANCHED) {
                mark |= bit;
                deepest[g] = prev[g];
            }
        }
        uint32_t *me = br_rec(s, call, keys, n, j, mix, true, &ghost);
        if (call == KVO__CALL_STORE) { /* the key's class, for a key to be stored */
            if (kvo__entry_ready(s, s->sc_ent[j])) {
                cont |= bit;
            } else {
                if (ghost) b->ends.used[br_cls(*me)]++; /* a return: a reuse of its class at its last store */
                *me = (*me & ~BR_CLS) | (cont & bit ? BR_CONT : 0);
            }
        }
        again = *me & BR_SEEN ? again | bit : again & ~bit;
        *me |= BR_SEEN;
        if (ghost) {
            if (!(seen & bit)) ghost_root |= bit;
            ghost_at[g] = j;
        }
        prev[g] = j;
        prev_mix[g] = mix;
        seen |= bit;
    }
    /* a store's last key of each group, to be stored, is of a LEAF class */
    for (uint64_t m = call == KVO__CALL_STORE ? seen : 0; m; m &= m - 1) {
        uint32_t g = (uint32_t)__builtin_ctzll(m);
        if (kvo__entry_ready(s, s->sc_ent[prev[g]])) continue;
        uint32_t *r = br_rec(s, call, keys, n, prev[g], prev_mix[g], false, &ghost);
        if (r) *r |= BR_LEAF;
    }
    /* a lookup ending at a known leaf (seen, never followed): the request
     * repeats an earlier one's whole chain (stores: the lookup did it, unless
     * lookups go one key at a time and the stores name the requests) */
    bool requests = call == KVO__CALL_LOOKUP || s->params.lookups_per_key;
    for (uint64_t m = requests ? again : 0; m; m &= m - 1) {
        uint32_t g = (uint32_t)__builtin_ctzll(m);
        uint32_t *r = br_rec(s, call, keys, n, prev[g], prev_mix[g], false, &ghost);
        if (r && !(*r & BR_CHILD)) {
            mark |= UINT64_C(1) << g;
            deepest[g] = prev[g];
        }
    }
    for (uint64_t m = ghost_root; m; m &= m - 1) {
        uint32_t g = (uint32_t)__builtin_ctzll(m);
        if (!(mark & (UINT64_C(1) << g)) || ghost_at[g] > deepest[g]) deepest[g] = ghost_at[g];
        mark |= UINT64_C(1) << g;
    }
    for (size_t j = 0; mark && j < n; j++) {
        uint32_t g = keys[j].group;
        if (!(mark & (UINT64_C(1) << g)) || j > deepest[g]) continue;
        uint32_t *r = br_rec(s, call, keys, n, j, kvo__key_mix(&keys[j]), false, &ghost);
        if (r) *r |= BR_MARKED;
    }
}

static int br_init(kvo_store *s) {
    kvo__branch *b = kvo__calloc(1, sizeof *b);
    if (!b) return kvo__error(KVO_ENOMEM, "kvo_store_create: out of memory (branch policy)");
    b->nsets = kvo__div_ceil_u64(BR_GHOSTS_X2 * s->max_entries, 2 * BR_WAYS);
    if (b->nsets == 0) b->nsets = 1;
    size_t bytes = (size_t)(b->nsets * BR_WAYS * sizeof *b->tab);
    b->tab = kvo__store_big_alloc(bytes, &b->base);
    if (!b->tab) {
        kvo__free(b);
        return kvo__error(KVO_ENOMEM, "kvo_store_create: cannot allocate the branch policy's history (%zu bytes)",
                          bytes);
    }
    memset(b->tab, 0, bytes);
    b->age_step = (uint32_t)kvo__div_ceil_u64(s->pool_cap, BR_AGE_LAP);
    s->branch = b;
    return 0;
}

static void br_fini(kvo_store *s) {
    if (!s->branch) return;
    kvo__free(s->branch->base);
    kvo__free(s->branch);
    s->branch = NULL;
}

/* Every queued entry READY, unpinned, in P or Q, with at most BR_USES uses
 * and an age within br_age_clamp's bound,
 * its key's record in the entry and not in the table (a 32-bit tag
 * collision in the same set would be reported too: 8 in 2^32 per entry). */
static int br_check(kvo_store *s) {
    static const uint8_t qs[3] = {BR_D, BR_Q, BR_P};
    if (s->branch->floor > BR_FLOOR_MAX)
        return kvo__error(KVO_ECORRUPT, "branch policy: Q's floor %llu exceeds %d", (unsigned long long)s->branch->floor,
                          BR_FLOOR_MAX);
    for (int k = 0; k < 3; k++) {
        uint64_t n = 0;
        for (uint32_t e = s->q[qs[k]].head; e != KVO__NIL; e = s->ent[e].next, n++) {
            const kvo__entry *x = &s->ent[e];
            if (x->q != qs[k] || x->state != KVO__E_READY || x->pins || x->freq > BR_USES)
                return kvo__error(KVO_ECORRUPT, "branch policy: entry %u in list %u: q %u state %u pins %u uses %u",
                                  e, qs[k], x->q, x->state, x->pins, x->freq);
            if (br_age_raw(s, e) >= BR_AGE_CAP + BR_AGE_LAP)
                return kvo__error(KVO_ECORRUPT, "branch policy: entry %u's age %u passed the clamp's bound %u", e,
                                  br_age_raw(s, e), BR_AGE_CAP + BR_AGE_LAP - 1);
            if (br_lookup(s->branch, kvo__key_mix(&x->key)))
                return kvo__error(KVO_ECORRUPT, "branch policy: stored entry %u's record is in the table too", e);
        }
        if (n != s->q[qs[k]].n)
            return kvo__error(KVO_ECORRUPT, "branch policy: list %u holds %llu entries, counts %llu", qs[k],
                              (unsigned long long)n, (unsigned long long)s->q[qs[k]].n);
    }
    return 0;
}

/* Admission (ops.admit): an absent marked key is stored; an unmarked one
 * while the batch's new keys fit in the free entries plus Q's and D's
 * entries, or plus Q's floor when they are under it: past that its room would come from P
 * with Q already at its floor, so it is not stored, nor are its group's
 * deeper keys (*denied, a bit per group: they would follow a miss). */
static bool br_admit(kvo_store *s, const kvo_chunk_key *keys, size_t i, uint64_t n_new, uint64_t *denied) {
    uint64_t bit = UINT64_C(1) << keys[i].group;
    if (*denied & bit) return false;
    const kvo__branch *b = s->branch;
    const br_slot *x = br_lookup(b, s->sc_mix[i]);
    if (x && (x->rec & BR_MARKED)) return true;
    uint64_t q = s->q[BR_Q].n + s->q[BR_D].n, floor = (q + s->q[BR_P].n) * b->floor / BR_FLOOR_ONE;
    uint64_t room = (s->max_entries > s->resident ? s->max_entries - s->resident : 0) + (q > floor ? q : floor);
    if (n_new < room) return true;
    *denied |= bit;
    return false;
}

const kvo__policy_ops kvo__policy_branch = {
    "branch", br_insert, br_hit, br_remove, br_reinsert, br_take, br_untake, br_evicted,
    br_ghost_claim, br_init, br_fini, true, br_observe, br_check, br_admit,
};
