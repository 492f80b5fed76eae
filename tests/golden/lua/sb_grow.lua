-- a table that grows until memory runs out
return {
  prune = function(c)
    local t, i = {}, 0
    while true do
      i = i + 1
      t[i] = i  --> here
    end
  end,
}
