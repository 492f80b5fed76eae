-- the budget is not an error pcall can catch
return {
  prune = function(c)
    while true do
      pcall(function() while true do end end)  --> here
    end
  end,
}
