/*
 * Sealing of stored chunks (the file tier's with file_secret, every Redis
 * value with a fleet secret): authenticated encryption of a chunk's payload
 * with XAES-256-GCM, bound to the chunk's header and to the name it is
 * stored under.  One implementation for both tiers (seal.c); built with
 * OpenSSL's libcrypto (KVO_WITH_OPENSSL), without it kvo__seal_create
 * returns KVO_ENOTSUP.
 *
 * Where the seal lives: in the chunk header of docs/file-format.md
 * (4096 bytes, the same for the file and the Redis tier).  A sealed chunk
 * has format version 2 (kvo__file_hdr_encode writes it when h.sealed), the
 * payload checksum field 0 (the tag authenticates the payload), and after
 * the header checksum (bytes 256..263) the seal record:
 *     264  algorithm (1: XAES-256-GCM)      u32
 *     268  reserved (0)                     u32
 *     272  key id                           8 bytes
 *     280  nonce                            24 bytes
 *     304  GCM tag                          16 bytes
 * The authenticated data is header bytes 0..303 (everything that names the
 * chunk: fingerprint, key, group, geometry, names, layout hash; and the
 * record up to the tag) followed by the caller's `name` (the Redis key; the
 * file tier's namespace directory), so that a value moved under another key
 * or into another namespace fails, and so does any changed header byte.
 *
 * Layering: a leaf of src/tiers (core only); file_ops.c, file_tier.c and
 * the Redis tier (remote_tier.c, reply.c) call it.
 * Thread rules: a kvo__seal is immutable after create and shared by every
 * thread; a kvo__seal_op is used by one thread at a time (the pool hands
 * them out under its own mutex).
 */
#ifndef KVO_TIERS_SEAL_H
#define KVO_TIERS_SEAL_H

#include <stdbool.h>

#include "core/internal.h"

#define KVO__SEAL_ALG_XAES_256_GCM 1u
#define KVO__SEAL_REC_OFF 264u     /* the seal record in the chunk header */
#define KVO__SEAL_KEYID_OFF 272u
#define KVO__SEAL_NONCE_OFF 280u
#define KVO__SEAL_TAG_OFF 304u     /* the authenticated data ends here */
#define KVO__SEAL_REC_END 320u
#define KVO__SEAL_NONCE_BYTES 24u
#define KVO__SEAL_TAG_BYTES 16u
#define KVO__SEAL_SECRET_MIN 16u   /* bytes of a secret, at least */

typedef struct kvo__seal kvo__seal;
typedef struct kvo__seal_op kvo__seal_op;

/* Whether this build can seal (OpenSSL). */
bool kvo__seal_available(void);

/* Derive the keys of `secret` (and of `previous`, accepted for opening only;
 * NULL or "" for none): HKDF-SHA256 with fixed info strings gives each an
 * AES-256 key and an 8-byte key id.  The secrets are not kept.  `what` names
 * the setting in messages (e.g. "remote tier: remote_secret"); no message
 * contains a secret or its length.  0, KVO_EINVAL (shorter than
 * KVO__SEAL_SECRET_MIN bytes), KVO_ENOTSUP (built without OpenSSL),
 * KVO_ENOMEM, KVO_EIO (libcrypto failed).  *out: kvo__seal_destroy. */
int kvo__seal_create(const char *secret, const char *previous, const char *what, kvo__seal **out);
/* Wipe the keys and free everything (every op given back first).  NULL is a
 * no-op. */
void kvo__seal_destroy(kvo__seal *s);

/* A cipher context for one thread at a time: from the seal's pool (made
 * when the pool is empty: the steady state allocates nothing), given back
 * with kvo__seal_op_give.  NULL when out of memory (message set). */
kvo__seal_op *kvo__seal_op_take(kvo__seal *s);
void kvo__seal_op_give(kvo__seal *s, kvo__seal_op *op);

/* Seal n payload bytes: src -> dst (may be the same memory), under the
 * current key, with a fresh random 192-bit nonce.  hdr: the 4096-byte
 * header with bytes 0..263 encoded (version 2); the record (algorithm, key
 * id, nonce) is written before, the tag after the payload is encrypted.
 * name/name_len: what the chunk is stored under (authenticated).  0 or
 * KVO_EIO (libcrypto failed, message set; dst then holds no valid value). */
int kvo__seal_value(kvo__seal_op *op, unsigned char *hdr, const void *name, size_t name_len, void *dst,
                    const void *src, size_t n);

/* Open a sealed payload in pieces as it arrives: begin (the record: the key
 * by its id, the nonce; the authenticated data), update with consecutive
 * pieces (src -> dst, may be the same memory; any sizes), end (the tag).
 * Only after end returned 0 are the bytes authentic; before, and after a
 * failure, dst holds bytes no one vouches for.  begin: 0, or KVO_ECORRUPT
 * when the header is not sealed by an algorithm and key this seal holds
 * (message names the key id, never a key); update: 0 or KVO_EIO; end: 0 or
 * KVO_ECORRUPT ("failed authentication"). */
int kvo__seal_open_begin(kvo__seal_op *op, const unsigned char *hdr, const void *name, size_t name_len);
int kvo__seal_open_update(kvo__seal_op *op, void *dst, const void *src, size_t n);
int kvo__seal_open_end(kvo__seal_op *op, const unsigned char *hdr);
/* begin, one update of the whole payload, end. */
int kvo__seal_open(kvo__seal_op *op, const unsigned char *hdr, const void *name, size_t name_len, void *dst,
                   const void *src, size_t n);

#ifdef KVO_TESTING
/* Tests only: XAES-256-GCM of C2SP's specification with a raw 32-byte key
 * (the published test vectors): ct gets n bytes, tag 16.  0 or KVO_EIO. */
int kvo__seal_test_xaes(const unsigned char key[32], const unsigned char nonce[24], const void *aad, size_t aad_len,
                        const void *pt, size_t n, unsigned char *ct, unsigned char tag[16]);
#endif

#endif
