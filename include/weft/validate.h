/* validate.h - the validate stage: a lowered program checked against the
 * rules of a sound plan. It runs after lowering and may simulate. */
#ifndef WEFT_VALIDATE_H
#define WEFT_VALIDATE_H

#include "weft/diag.h"
#include "weft/sim.h"

/* Which rules validate_program checks. */
typedef struct validate_opts {
  bool skip_memory;       /* rule 5 is left to the caller, who simulates the
                           * step anyway (validate_memory_sim) */
} validate_opts;

/* Rules 3 (order: collectives entered in one order, no deadlock) and 5
 * (memory) on a lowered program (NULL o: both); the others hold once
 * lower_plan gave the program. False after the diagnostics of the first
 * rule broken. */
bool validate_program(const weft_program *pr, const validate_opts *o, weft_diags *dg);

/* Rule 5 on the memory model of the estimate: every device's peak in the
 * simulated step fits the memory of the cluster's device. False after an
 * error naming the device with the highest peak, its peak and capacity,
 * the instruction where the peak is reached and the bytes live there by
 * role. */
bool validate_memory_sim(const weft_sim *s, weft_diags *dg);

#endif
