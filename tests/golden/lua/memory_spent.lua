-- keeps all but 40 KB of a 1 MiB budget, so that the next script cannot start
local keep = {}
while collectgarbage("count") * 1024 < 1048576 - 40000 do
  keep[#keep + 1] = string.rep("x", 10000)
end
return { prune = function(c) return #keep > 0 end }
