-- while true do end
return {
  prune = function(c)
    while true do end  --> here
  end,
}
