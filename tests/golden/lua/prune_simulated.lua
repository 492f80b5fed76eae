-- candidates pass until the simulator has timed them
return {
  prune = function(c) return not c.simulated end,
}
