-- the selector of the split matches nothing in the model
return {
  policy = function(model, cluster, weft)
    return {
      weft.mesh("m", {{"tp", 4}}),
      weft.split("h.*.mlp", "hidden", 4, "tp"),
      weft.assign("all", "m", {"tp"}),
    }
  end,
}
