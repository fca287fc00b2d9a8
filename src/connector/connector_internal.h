/* Internal declarations of the connector layer (also used by its tests). */
#ifndef KVO_CONNECTOR_INTERNAL_H
#define KVO_CONNECTOR_INTERNAL_H

#include "core/internal.h"

/* The default min_hit_tokens: the largest tokens_per_chunk of an offloaded
 * group (0 when none is offloaded). */
uint64_t kvo__agree_min_hit_default(const kvo_plan *plan);

#endif
