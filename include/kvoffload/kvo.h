/* kvoffload: the umbrella header.  Include this one. */
#ifndef KVOFFLOAD_KVO_H
#define KVOFFLOAD_KVO_H
#include "kvo_common.h"
#include "kvo_geometry.h"
#include "kvo_keys.h"
#include "kvo_store.h"
#include "kvo_transfer.h"
#include "kvo_file_tier.h"
#include "kvo_cascade.h"
#include "kvo_connector.h"
#include "kvo_metrics.h"
#include "kvo_config.h"
#endif
