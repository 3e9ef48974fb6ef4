// Counts heap allocations in the process that links this target (the
// benchmark only): malloc/calloc/realloc defined here interpose on glibc's
// for every caller, Swift runtime included, and forward to __libc_*.
#ifndef CALLOCATIONCOUNTER_H
#define CALLOCATIONCOUNTER_H
#include <stdint.h>

/// Allocations (malloc, calloc, realloc) since the process started.
uint64_t blc_allocation_count(void);

/// Calls this so the linker keeps the interposing definitions.
void blc_allocation_counter_link(void);
#endif
