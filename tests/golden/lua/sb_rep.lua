-- 4 GB in one string
return {
  prune = function(c)
    local big = string.rep("x", 4 * 1024 * 1024 * 1024)  --> here
    return #big > 0
  end,
}
