/*
 * kvoffload configuration loader: one JSON object -> the parameters of the
 * plan, the connector and the file tier.
 *
 * Engines already configure KV offloading with their own names: vLLM through
 * kv_transfer_config.kv_connector_extra_config (block_size, blocks_per_chunk,
 * cpu_bytes_to_use, eviction_policy, store_threshold, and the kvo_* keys of
 * kvoffload's vLLM spec: kvo_file_root, kvo_redis_url, ...; the spec's
 * engine-only keys are accepted and ignored), LMCache through its
 * config file (chunk_size, max_local_cpu_size in GB, local_disk,
 * max_local_disk_size in GB, remote_url).  kvo_config_from_json accepts those
 * names beside kvoffload's own (host_bytes, policy, file_root, ...), so an
 * operator can hand the engine's existing configuration to kvoffload
 * unchanged.  docs/config.md has the full table: every key, its type, the
 * field it sets and where the name comes from.
 *
 * Shape.  Either a flat object of keys, or vLLM's whole kv_transfer_config
 * ({"kv_connector": ..., "kv_role": ..., "kv_connector_extra_config": {...}}):
 * then the extra config is read and kv_connector, kv_role, engine_id and
 * kv_connector_module_path are accepted and ignored.
 *
 * Rules.  An unknown key is KVO_EINVAL naming it and the nearest valid key
 * (edit distance): a typo never silently falls back to a default.  Two names
 * of one setting (block_size and chunk_size, cpu_bytes_to_use and
 * max_local_cpu_size, ...) may both be given only with the same value.  Keys
 * not given leave the caller's parameters as they were: apply the config to
 * kvo_X_default_params() (or to values from the command line) and the config
 * overrides only what it names.
 *
 * The config is an opaque handle (it grows without breaking callers; see the
 * struct_size convention in kvo_common.h).
 */
#ifndef KVOFFLOAD_KVO_CONFIG_H
#define KVOFFLOAD_KVO_CONFIG_H

#include "kvo_common.h"
#include "kvo_geometry.h"
#include "kvo_file_tier.h"
#include "kvo_remote_tier.h"
#include "kvo_connector.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct kvo_config kvo_config;

/** Parse a configuration from JSON text (len bytes, need not be NUL-
 *  terminated).  *out is owned by the caller (kvo_config_destroy); it owns
 *  copies of every string.  Any thread; no shared state.  Errors: KVO_EPARSE
 *  (not JSON, not an object, a duplicate key: message has line and column),
 *  KVO_EINVAL (an unknown key, naming the nearest valid one; a value of the
 *  wrong type or out of range, naming the key, the value and what is
 *  accepted; two names of one setting with different values), KVO_ENOTSUP
 *  (a setting kvoffload cannot honour, e.g. LMCache's local_cpu: false; a
 *  vLLM spec_name whose keys another reader takes, TieringOffloadingSpec's
 *  secondary_tiers),
 *  KVO_ENOMEM.  On failure *out is left untouched. */
KVO_API int kvo_config_from_json(const char *text, size_t len, kvo_config **out);

/** kvo_config_from_json on a file's contents.  Errors as that, prefixed with
 *  the path, and KVO_EIO when the file cannot be read. */
KVO_API int kvo_config_from_file(const char *path, kvo_config **out);

/** Destroy; NULL is a no-op.  Strings the apply functions stored in params
 *  (file tier root, shm_path, salt) die with it. */
KVO_API void kvo_config_destroy(kvo_config *c);

/** Overwrite the fields of *p that the config sets (block_size,
 *  blocks_per_chunk, target_chunk_bytes); leave the others.  Errors:
 *  KVO_EINVAL for a NULL argument. */
KVO_API int kvo_config_apply_plan(const kvo_config *c, kvo_plan_params *p);

/** Overwrite the fields of *p that the config sets (host_bytes, policy,
 *  admit_after, transfer_threads, ..., file_mode; docs/config.md lists
 *  them).  plan and file_tier are never touched: the caller creates those.
 *  String fields (shm_path, salt) point into the config, which must outlive
 *  the connector's creation.  Errors: KVO_EINVAL for a NULL argument. */
KVO_API int kvo_config_apply_connector(const kvo_config *c, kvo_connector_params *p);

/** Overwrite the file-tier fields the config sets (root from file_root,
 *  kvo_file_root or local_disk, quota_bytes from file_quota_bytes,
 *  kvo_file_bytes or max_local_disk_size; shared, max_pending_writes and
 *  max_staging_bytes from kvo_file_shared, kvo_file_max_pending_writes and
 *  kvo_file_staging_bytes; file_secret from file_secret).
 *  root and file_secret point into the config (the tier copies them at
 *  create; the config wipes its secrets when destroyed).  plan is never
 *  touched.  Errors: KVO_EINVAL for a NULL argument. */
KVO_API int kvo_config_apply_file_tier(const kvo_config *c, kvo_file_tier_params *p);

/** True when the config names a file tier (file_root or local_disk). */
KVO_API bool kvo_config_has_file_tier(const kvo_config *c);

/** The model (preset name or path for kvo_model_open), or NULL when not
 *  given.  Valid while c lives. */
KVO_API const char *kvo_config_model(const kvo_config *c);

/** remote_url (LMCache's) or kvo_redis_url (kvoffload's vLLM spec), e.g.
 *  "redis://host:7000[,host:port...]", or NULL:
 *  the remote tier's seed nodes (kvo_remote_tier.h).  Valid while c lives. */
KVO_API const char *kvo_config_remote_url(const kvo_config *c);

/** Overwrite the remote-tier fields the config sets (url from remote_url or
 *  kvo_redis_url, key_prefix from remote_key_prefix or kvo_redis_prefix;
 *  ttl_s, io_threads and max_pending_writes from kvo_redis_ttl_s,
 *  kvo_redis_io_threads and kvo_redis_max_pending_writes; secret and
 *  secret_previous from remote_secret and remote_secret_previous, else the
 *  tier reads KVO_REMOTE_SECRET); strings point into the config (the tier
 *  copies them at create; the config wipes its secrets when destroyed).  plan and layout_hash are never touched:
 *  the caller creates the tier (when kvo_config_remote_url is not NULL) and
 *  passes it in kvo_connector_params.remote_tier.  Errors: KVO_EINVAL for
 *  a NULL argument. */
KVO_API int kvo_config_apply_remote_tier(const kvo_config *c, kvo_remote_tier_params *p);

/** Number of keys the loader knows, and key i's name (NULL past the end):
 *  for help texts and the docs table test.  Static storage. */
KVO_API size_t kvo_config_key_count(void);
KVO_API const char *kvo_config_key_name(size_t i);

#ifdef __cplusplus
}
#endif
#endif
