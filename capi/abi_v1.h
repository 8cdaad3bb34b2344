/* The first published (ABI v1) size of every size-first struct of co2.h on LP64 targets: the
 * smallest `size` the library accepts. A struct grows only at its end, so a caller built against
 * any earlier header passes a size between this and the library's own sizeof; the library reads
 * (and, for stats, writes) only that many bytes, and fields beyond it take their INIT defaults.
 * These values never change. C-compatible so that C tests can include it. */
#ifndef CO2_CAPI_ABI_V1_H
#define CO2_CAPI_ABI_V1_H

#define CO2_COMM_CONFIG_V1_SIZE 48u
#define CO2_ENGINE_CONFIG_V1_SIZE 88u
#define CO2_TENSOR_V1_SIZE 48u
#define CO2_SEGMENT_V1_SIZE 40u
#define CO2_ALLOCATOR_V1_SIZE 32u
#define CO2_ENGINE_STATS_V1_SIZE 136u /* 160 since the tau advisor fields */

#endif
