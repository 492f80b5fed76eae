-- no_recompute.lua - plans that keep every activation: the search tries
-- no recomputation (faster steps where memory allows, none where it does not).
return {
  space = function(s)
    s.recompute = {"none"}
  end,
}
