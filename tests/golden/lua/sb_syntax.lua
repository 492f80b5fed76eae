-- a comparison without its right side
return {
  prune = function(c)
    return c.tp <=
  end,  --> here
}
