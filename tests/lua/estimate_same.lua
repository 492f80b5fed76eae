-- estimate_same.lua - a policy that writes tensor and data parallelism for
-- the mlp on four devices and prints what weft.estimate says of it, as
-- JSON, so that tests/lua_check.sh compares it with `weft estimate --json`
-- of the plan weft search writes.

-- JSON of a Lua value: objects with their keys sorted, numbers exact
local function json(v)
  local t = type(v)
  if t == "table" then
    if #v > 0 or next(v) == nil then
      local parts = {}
      for i = 1, #v do parts[i] = json(v[i]) end
      return "[" .. table.concat(parts, ",") .. "]"
    end
    local keys = {}
    for k in pairs(v) do keys[#keys + 1] = k end
    table.sort(keys)
    local parts = {}
    for i, k in ipairs(keys) do parts[i] = ("%q:%s"):format(k, json(v[k])) end
    return "{" .. table.concat(parts, ",") .. "}"
  elseif t == "number" then
    return math.type(v) == "integer" and ("%d"):format(v) or ("%.17g"):format(v)
  elseif t == "string" then
    return ("%q"):format(v)
  end
  return tostring(v)
end

return {
  policy = function(model, cluster, weft)
    local plan = {
      weft.mesh("m", {{"dp", 2}, {"tp", 2}}),
      weft.split({"h", "a", "o"}, "hidden", 2, "tp"),
      weft.replicate("loss", 2, "tp"),
      weft.split("all", "batch", 2, "dp"),
      weft.assign("all", "m", {"dp", "tp"}),
    }
    print("ESTIMATE " .. json(weft.estimate(plan)))
    return plan
  end,
}
