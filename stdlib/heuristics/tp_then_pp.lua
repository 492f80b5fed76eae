-- tp_then_pp.lua - how Narayanan et al. (2021, "Efficient Large-Scale
-- Language Model Training on GPU Clusters Using Megatron-LM", takeaways 1
-- and 2) combine the three parallelisms: tensor parallelism up to the
-- devices of a node, pipeline parallelism across nodes only once a node is
-- one tensor-parallel group, data parallelism over the rest. A rule, not a
-- plan: the search still chooses within it.
return {
  prune = function(c, model, cluster)
    local node = cluster.devices_per_node
    if c.tp > node or node % c.tp ~= 0 then
      return false  -- a tensor-parallel group reaching across nodes
    end
    if c.pp > 1 and c.tp < node then
      return false  -- a pipeline while a node still has room for tensor parallelism
    end
    return true
  end,
}
