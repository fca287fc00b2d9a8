/*
 * The reference engine wired to the kvoffload connector: a host tier (and
 * optionally a file tier and a remote tier) behind the engine's offload
 * hooks.
 *
 * kvo_eng_conn owns the chunk plan (built from the engine's model), the
 * connector (host arena, store, transfer engine) and, when file_dir is given,
 * the file tier.  The engine must outlive it.  One thread at a time (the
 * engine's); the connector's own threads copy in the background.
 */
#ifndef KVO_ENGINE_OFFLOAD_H
#define KVO_ENGINE_OFFLOAD_H

#include "kvo_engine.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct kvo_eng_conn_params {
    uint64_t chunk_tokens;     /* plan block_size (tokens per chunk); default 64;
                                  0 = the library's automatic plan; when a
                                  group's block size (or the hash unit) does
                                  not divide it, each group gets
                                  ceil(chunk_tokens / tpb) blocks (rounded up
                                  to whole hash units) */
    uint64_t host_bytes;       /* host tier bytes; required */
    const char *file_dir;      /* file tier root; NULL = no file tier */
    uint64_t file_bytes;       /* file tier quota; required with file_dir */
    kvo_file_mode file_mode;   /* write-through (default) or write-back
                                  (kvo_connector_params.file_mode; write-back
                                  persists host chunks at destroy) */
    const char *remote_url;    /* remote tier (Redis Cluster) seed nodes,
                                  redis://host:port[,...]; NULL = none */
    const char *remote_prefix; /* its key namespace; NULL = the tier's
                                  default ("kvo") */
    uint32_t remote_lookup_budget_us; /* how long a lookup may answer
                                  PENDING while the remote tier's presence
                                  queries run (kvo_connector_params); 0 = the
                                  connector's default (20 ms) */
    bool verify_checksums;     /* connector verifies host chunks on load */
    uint32_t transfer_threads; /* default 2 */
    uint32_t fail_every_load;  /* tests: report every k-th completed load as
                                  failed (the engine must recompute); 0 off */
    bool trim_hits;            /* tests: give the engine a hit shorter than
                                  the connector's by less than the smallest
                                  block (where exactly the blocks it needs
                                  are loaded), so
                                  the last loaded block is only partly valid
                                  and the engine recomputes over its tail */
} kvo_eng_conn_params;

kvo_eng_conn_params kvo_eng_conn_default_params(void);

typedef struct kvo_eng_conn kvo_eng_conn;

/** Build the plan, the file tier (if asked) and the connector, register the
 *  engine's layout.  Errors: the library's (message passed on). */
int kvo_eng_conn_create(kvo_eng *e, const kvo_eng_conn_params *p, kvo_eng_conn **out);
/** Wait for copies, destroy connector, file and remote tiers (files and
 *  remote values stay). */
void kvo_eng_conn_destroy(kvo_eng_conn *c);
/** The hooks to put in kvo_eng_run_params.offload; valid while c lives. */
const kvo_eng_offload *kvo_eng_conn_offload(kvo_eng_conn *c);
const kvo_plan *kvo_eng_conn_plan(const kvo_eng_conn *c);
kvo_connector *kvo_eng_conn_connector(kvo_eng_conn *c);
/** The largest tokens_per_chunk of the plan: use as release_align. */
uint64_t kvo_eng_conn_chunk_tokens(const kvo_eng_conn *c);
/** Settle every store (poll until no host-tier entry is PENDING, so each
 *  stored chunk is complete and checksummed), then, with a remote tier, wait
 *  until its queued puts are sent, and with a file tier until file-tier
 *  writes are on disk (before a restart); in write-back mode
 *  first write the host tier's chunks the file tier lacks
 *  (kvo_connector_flush_to_file).  0 or error (KVO_ETIMEDOUT after 60 s). */
int kvo_eng_conn_flush(kvo_eng_conn *c);
/** Hook calls that failed (stores, waits) and were tolerated. */
uint64_t kvo_eng_conn_hook_errors(const kvo_eng_conn *c);
/** Hits shortened by trim_hits. */
uint64_t kvo_eng_conn_trimmed_hits(const kvo_eng_conn *c);

#ifdef __cplusplus
}
#endif
#endif
