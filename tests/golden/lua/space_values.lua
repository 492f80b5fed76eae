-- tp must be a list of integers
return {
  space = function(s) s.tp = "wide" end,
}
