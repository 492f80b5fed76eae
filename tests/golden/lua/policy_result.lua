-- policy returns a string
return {
  policy = function(model, cluster, weft) return "tp = 4" end,
}
