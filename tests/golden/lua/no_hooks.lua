-- a table, but no hook in it
return { name = "nothing" }
