-- os.execute: there is no os in the sandbox
return {
  prune = function(c)
    os.execute("touch escaped")  --> here
  end,
}
