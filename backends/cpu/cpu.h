/* cpu.h - the CPU backend as the registry (backends/backend.c) sees it: its
 * table of functions. */
#ifndef WEFT_CPU_H
#define WEFT_CPU_H

#include "weft/backend.h"

extern const weft_backend weft_backend_cpu;

#endif
