#include "CAllocationCounter.h"
#include <stddef.h>

// glibc's own entry points (exported for exactly this kind of wrapper).
extern void *__libc_malloc(size_t size);
extern void *__libc_calloc(size_t count, size_t size);
extern void *__libc_realloc(void *pointer, size_t size);
extern void __libc_free(void *pointer);

static uint64_t allocations;

void *malloc(size_t size) {
    __atomic_add_fetch(&allocations, 1, __ATOMIC_RELAXED);
    return __libc_malloc(size);
}

void *calloc(size_t count, size_t size) {
    __atomic_add_fetch(&allocations, 1, __ATOMIC_RELAXED);
    return __libc_calloc(count, size);
}

void *realloc(void *pointer, size_t size) {
    __atomic_add_fetch(&allocations, 1, __ATOMIC_RELAXED);
    return __libc_realloc(pointer, size);
}

void free(void *pointer) {
    __libc_free(pointer);
}

uint64_t blc_allocation_count(void) {
    return __atomic_load_n(&allocations, __ATOMIC_RELAXED);
}

void blc_allocation_counter_link(void) {}
