-- recursion without end
local function down(n)
  return down(n + 1) + 1  --> here
end
return {
  prune = function(c) return down(0) > 0 end,
}
