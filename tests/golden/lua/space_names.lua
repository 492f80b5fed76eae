-- no schedule is called fastest
return {
  space = function(s) s.schedule = {"fastest"} end,
}
