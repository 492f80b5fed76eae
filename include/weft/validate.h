/* validate.h - the validate stage: a lowered program checked against the
 * rules of a sound plan. It runs after lowering and may simulate. */
#ifndef WEFT_VALIDATE_H
#define WEFT_VALIDATE_H

#include "weft/diag.h"
#include "weft/sim.h"

/* Rule 5 on the memory model of the estimate: every device's peak in the
 * simulated step fits the memory of the cluster's device. False after an
 * error naming the device with the highest peak, its peak and capacity,
 * the instruction where the peak is reached and the bytes live there by
 * role. */
bool validate_memory_sim(const weft_sim *s, weft_diags *dg);
/* The same, simulating the program on its cluster's hardware model (or
 * symbolically when the cluster lacks rates). */
bool validate_memory(const weft_program *pr, weft_diags *dg);

#endif
