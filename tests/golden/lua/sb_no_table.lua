-- the hooks are made, but not returned
local hooks = {}
hooks.prune = function(c) return c.tp <= 4 end  --> here
