-- a space hook that sets every field
return {
  space = function(s, model, cluster)
    s.tp = {1, 2, 4}
    s.pp = {1, 2}
    s.micro_batch_size = {1, 2, 4, 8}
    s.schedule = {"gpipe", "one_f_one_b", "interleaved"}
    s.interleave = {2}
    s.recompute = {"none", "full"}
    s.zero = {0, 1}
    s.uneven = false
  end,
}
