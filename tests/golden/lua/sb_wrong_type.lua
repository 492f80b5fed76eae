-- prune answers true or false, not a number
return {
  prune = function(c)  --> here
    return c.tp
  end,
}
