-- tp_at_most_2.lua - forbids tensor parallelism wider than 2 (tests/lua_check.sh)
return {
  prune = function(c)
    return c.tp <= 2
  end,
}
