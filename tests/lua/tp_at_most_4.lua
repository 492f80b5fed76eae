-- tp_at_most_4.lua - forbids tensor parallelism wider than 4 (tests/lua_check.sh)
return {
  prune = function(c)
    return c.tp <= 4
  end,
}
