-- a binary chunk (what string.dump makes), given to load
local chunk = "\27LuaT\0\25\147\r\n\26\n\4\8\8\120\86\0\0"
local f = load(chunk)  --> here
return { prune = function(c) return f() end }
