/* Places a caller's struct at the very end of a readable page, right before an inaccessible one,
 * so that the library reading or writing one byte past the caller's struct crashes the test; a
 * canary before that page catches writes too where the guard page cannot be had. For the tests
 * of callers built against an older co2.h (abi_v1_test.c, abi_layout_test.cpp). C and C++;
 * a C file defines _DEFAULT_SOURCE before its first include (mmap flags under -std=c99). */
#ifndef CO2_TESTS_CAPI_GUARD_PAGE_H
#define CO2_TESTS_CAPI_GUARD_PAGE_H

#include <stddef.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

enum { CO2_GUARD_CANARY_BYTES = 16 };
#define CO2_GUARD_CANARY ((unsigned char)0xA5)

/* `bytes` of zeroed memory whose end is followed by CO2_GUARD_CANARY_BYTES of CO2_GUARD_CANARY
 * and then an inaccessible page. */
static inline void *co2_at_page_end(size_t bytes) {
    const size_t page = (size_t)sysconf(_SC_PAGESIZE);
    void *mapped = mmap(NULL, 2 * page, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (mapped == MAP_FAILED) return NULL;
    unsigned char *base = (unsigned char *)mapped;
    if (mprotect(base + page, page, PROT_NONE) != 0) return NULL;
    memset(base + page - CO2_GUARD_CANARY_BYTES, CO2_GUARD_CANARY, CO2_GUARD_CANARY_BYTES);
    return base + page - CO2_GUARD_CANARY_BYTES - bytes;
}

static inline int co2_canary_intact(const void *object, size_t bytes) {
    const unsigned char *c = (const unsigned char *)object + bytes;
    for (int i = 0; i < CO2_GUARD_CANARY_BYTES; ++i)
        if (c[i] != CO2_GUARD_CANARY) return 0;
    return 1;
}

/* The same object moved flush against the inaccessible page (no canary), for reads. */
static inline void *co2_flush_at_page_end(const void *object, size_t bytes) {
    void *at = co2_at_page_end(bytes);
    if (!at) return NULL;
    unsigned char *moved = (unsigned char *)at + CO2_GUARD_CANARY_BYTES;
    memmove(moved, object, bytes);
    return moved;
}

#endif
