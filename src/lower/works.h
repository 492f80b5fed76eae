/* works.h - the lower stage's own use of works (lower.h, lwork): interning
 * them while programs are emitted. Other stages read the kept works only. */
#ifndef WEFT_LOWER_WORKS_H
#define WEFT_LOWER_WORKS_H

#include "weft/lower.h"

lower_works *lower_works_new(void);
void lower_works_free(lower_works *w);
/* w moved into a, where no more works can be added; w is freed. */
lower_works *lower_works_keep(arena *a, lower_works *w);
/* The work of a compute, copy or step instruction, interned; -1 for other kinds. */
int lower_work_of(lower_works *w, const weft_program *pr, const lins *ins);

#endif
