-- counts to a million
return {
  prune = function(c)
    local n = 0
    for i = 1, 1000000 do n = n + i end
    return n > 0
  end,
}
