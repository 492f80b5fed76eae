-- a policy in a file named like a keyword: its plan is plan_plan
return {
  policy = function(model, cluster, weft)
    return { weft.mesh("m", {{"dp", 4}}), weft.split("all", "batch", 4, "dp"), weft.assign("all", "m", {"dp"}) }
  end,
}
