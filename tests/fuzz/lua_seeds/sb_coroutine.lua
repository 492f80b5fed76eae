-- a coroutine that runs forever
return {
  prune = function(c)
    local co = coroutine.wrap(function()
      while true do end  --> here
    end)
    return co()
  end,
}
