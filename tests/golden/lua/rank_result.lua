-- rank forgets to return
return {
  rank = function(c)
    local r = c.tp * 2
  end,
}
