-- o is split along hidden but a is not: o reads what a holds whole
return {
  policy = function(model, cluster, weft)
    return {
      weft.mesh("m", {{"tp", 4}}),
      weft.split("o", "hidden", 4, "tp"),
      weft.assign({"h", "a", "loss"}, 0),
      weft.assign("o", "m", {"dp"}),
    }
  end,
}
