/* The first published (ABI v1) size of every size-first struct of co2.h: the smallest `size`
 * the library accepts. Each is where the struct's last v1 field ends (on LP64: comm config 48,
 * engine config 88, tensor 48, segment 40, allocator 32, engine stats 136; the stats grew to 160
 * with the tau advisor). A struct grows only at its end, so a caller built against any earlier
 * header passes a size between this and the library's sizeof; the library reads (for stats:
 * writes) only that many bytes, and fields beyond it keep their INIT defaults. These never
 * change: when a field is added, the struct's line here stays as it is. C-compatible, for the
 * C tests. */
#ifndef CO2_CAPI_ABI_V1_H
#define CO2_CAPI_ABI_V1_H

#include <stddef.h>

#include "co2/co2.h"

#define CO2_V1_END(type, last_field) (offsetof(type, last_field) + sizeof(((type *)0)->last_field))

#define CO2_COMM_CONFIG_V1_SIZE CO2_V1_END(co2_comm_config_t, chunk_bytes)
#define CO2_ENGINE_CONFIG_V1_SIZE CO2_V1_END(co2_engine_config_t, reserved0)
#define CO2_TENSOR_V1_SIZE CO2_V1_END(co2_tensor_t, role)
#define CO2_SEGMENT_V1_SIZE CO2_V1_END(co2_segment_t, reserved0)
#define CO2_ALLOCATOR_V1_SIZE CO2_V1_END(co2_allocator_t, release)
#define CO2_ENGINE_STATS_V1_SIZE CO2_V1_END(co2_engine_stats_t, last_clip_fraction)

#endif
