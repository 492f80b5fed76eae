-- a policy whose plan the prune hook refuses
return {
  policy = function(model, cluster, weft)
    return { weft.mesh("m", {{"dp", 4}}), weft.split("all", "batch", 4, "dp"), weft.assign("all", "m", {"dp"}) }
  end,
  prune = function(c) return c.dp < 4 end,
}
