-- space returns a number
return {
  space = function(s) return 5 end,
}
