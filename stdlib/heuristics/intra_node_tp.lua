-- intra_node_tp.lua - tensor parallelism only inside a node: the search
-- tries every tensor-parallel degree that divides a node's devices (three
-- and six as well as the powers of two), and drops any candidate whose
-- tensor-parallel groups would reach across a node, where its collectives
-- after every layer would cross the slower links.
return {
  space = function(s, model, cluster)
    local tp = {}
    for t = 1, cluster.devices_per_node do
      if cluster.devices_per_node % t == 0 and cluster.devices % t == 0 then
        tp[#tp + 1] = t
      end
    end
    s.tp = tp
  end,
  prune = function(c, model, cluster)
    return c.tp <= cluster.devices_per_node and cluster.devices_per_node % c.tp == 0
  end,
}
