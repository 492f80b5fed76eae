-- memory_first.lua - the plan that needs least memory per device first:
-- candidates ranked by their peak memory (the simulator's once known, the
-- analytic estimate before), step time breaking ties. What to run when
-- memory is what is short, or to leave room for larger batches later.
return {
  rank = function(c)
    return c.peak_memory_bytes or c.analytic_memory_bytes
  end,
}
