#include <stdio.h>
#include "kvoffload/kvo.h"
#include "kvoffload/kvo_connector.h"
#include "kvoffload/kvo_file_tier.h"
#include "kvoffload/kvo_cuda.h"
#include "kvoffload/kvo_remote_tier.h"
#define S(t) printf(#t " %zu\n", sizeof(t));
int main(void){S(kvo_group_desc)S(kvo_plan_params)S(kvo_group_plan)S(kvo_store_params)S(kvo_store_entry)S(kvo_store_event)S(kvo_store_stats)S(kvo_arena_params)S(kvo_file_tier_params)S(kvo_file_tier_stats)S(kvo_file_completion)S(kvo_transfer_params)S(kvo_segment)S(kvo_xfer_op)S(kvo_xfer_result)S(kvo_transfer_stats)S(kvo_connector_params)S(kvo_request_desc)S(kvo_lookup_result)S(kvo_completion)S(kvo_connector_stats)S(kvo_request_stats)S(kvo_cuda_params)S(kvo_remote_tier_params)S(kvo_remote_tier_stats)S(kvo_remote_completion)S(kvo_cuda_stats)S(kvo_tenant_stats)return 0;}
