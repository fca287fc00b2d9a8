/* kvoffload connector: request-level lookup, load and store.
 * (Filled in by the connector work; see issue "The engine connector".) */
#ifndef KVOFFLOAD_KVO_CONNECTOR_H
#define KVOFFLOAD_KVO_CONNECTOR_H
#include "kvo_store.h"
#include "kvo_transfer.h"
#include "kvo_file_tier.h"
#endif
