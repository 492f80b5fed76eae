-- require: no modules, no package
local socket = require("socket")  --> here
return { prune = function(c) end }
