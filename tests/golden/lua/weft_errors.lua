-- each wrong call of the weft library, caught and printed
local function try(f, ...)
  local ok, err = pcall(f, ...)
  print(ok and "no error" or err)
end
try(weft.split, "h", 5, 2, "tp")
try(weft.split, "h", "in", 2, "tp")
try(weft.split, "h", "hidden", 0, "tp")
try(weft.split, {}, "hidden", 2, "tp")
try(weft.split, "h..x", "hidden", 2, "tp")
try(weft.mesh, "m", 4)
try(weft.mesh, "m", {{"tp"}})
try(weft.mesh, "m", {{"tp", 2}, {"tp", 2}})
try(weft.mesh, "m", {{"tp", 8}})
try(weft.mesh, "m", {{"tp", 2}}, {0})
try(weft.mesh, "m", {{"tp", 2}}, {0, 9})
try(weft.mesh, "m", {{"tp", 2}}, {1, 1})
try(weft.assign, "all", "m", {})
try(weft.assign, "all", "m", {"tp", -1})
try(weft.schedule, "fastest")
try(weft.recompute, "h", "half")
try(weft.shard, "moments", "all", "dp")
try(weft.zero, 4)
-- what only a whole list says
local tp = weft.mesh("m", {{"tp", 4}})
try(weft.estimate, {{kind = 5}})
try(weft.estimate, {{kind = "order"}})
try(weft.estimate, {5})
try(weft.estimate, {})
try(weft.estimate, {tp, tp})
try(weft.estimate, {weft.stage("s", "h"), weft.stage("s", "o")})
try(weft.estimate, {weft.assign("all", "n", {"tp"})})
try(weft.estimate, {weft.split("h.*.x", "hidden", 4, "tp")})
local deep = {weft.buckets(0)}
for i = 1, 20 do deep = {deep} end
try(weft.estimate, deep)
local many, b = {}, weft.buckets(0)
for i = 1, 100001 do many[i] = b end
try(weft.estimate, many)
local meshes = {}
for i = 1, 65 do meshes[i] = weft.mesh("m" .. i, {{"tp", 1}}) end
try(weft.estimate, meshes)
-- a plan that does not build: nil, and why
print(weft.estimate({tp, weft.split({"h", "a", "o"}, "hidden", 4, "tp")}))
print(weft.source({tp, weft.split({"h", "a", "o"}, "hidden", 4, "tp"), weft.replicate("loss", 4, "tp"),
                   weft.assign("all", "m", {"tp"}), weft.zero(1, "tp"), weft.buckets(1048576), weft.buckets(1000)}))
return { prune = function(c) return true end }
