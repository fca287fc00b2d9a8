/* kvoffload file tier: persistent chunk store on local or shared storage.
 * (Filled in by the file-tier work; see issue "File tier".) */
#ifndef KVOFFLOAD_KVO_FILE_TIER_H
#define KVOFFLOAD_KVO_FILE_TIER_H
#include "kvo_store.h"
#endif
