-- io.open: there is no io in the sandbox
return {
  prune = function(c)
    local f = io.open("/etc/passwd")  --> here
    return f == nil
  end,
}
