-- a policy with tensor and data parallelism, and hooks that rank and prune
return {
  policy = function(model, cluster, weft)
    local plan = {
      weft.mesh("m", {{"dp", 2}, {"tp", 2}}),
      weft.split({"h", "a", "o"}, "hidden", 2, "tp"),
      weft.replicate("loss", 2, "tp"),
      weft.split("all", "batch", 2, "dp"),
      weft.split("all", "batch", 2, "mb", true),
      weft.assign("all", "m", {"dp", "tp"}),
      weft.zero(2),
      weft.buckets(1 << 20),
    }
    local e = weft.estimate(plan)
    if e and e.fits then return plan end
  end,
  rank = function(c) return c.step_time_s or c.analytic_time_s end,
  prune = function(c) return c.tp <= 4 end,
}
