-- megatron.lua - Megatron-LM's plan for the standard gpt model, written by
-- a policy as Narayanan et al. (2021, "Efficient Large-Scale Language
-- Model Training on GPU Clusters Using Megatron-LM") choose it: tensor
-- parallelism inside a node, as wide as the heads and the vocabulary
-- divide; then the fewest pipeline stages, across nodes, with which the
-- model fits; data parallelism over the devices left; micro-batches of one
-- sample in a 1F1B schedule. The decisions are those of the standard
-- library's strategy megatron(layers, tp, pp, dp, micro_batches)
-- (stdlib/strategies.plan), so both give the same program.

-- the operator of the model named name
local function operator(model, name)
  for _, op in ipairs(model.operators) do
    if op.name == name then return op end
  end
end

-- "h[0..6]": the blocks lo to hi - 1
local function blocks(lo, hi)
  return ("h[%d..%d]"):format(lo, hi)
end

-- megatron_tp(tp): attention by heads and the MLP by its hidden units,
-- column- then row-parallel; the embedding, the head and the loss by the
-- vocabulary; the operators between them replicated
local function tensor_parallel(weft, tp)
  return {
    weft.split("**.attn.c_attn", "n", tp, "tp"),
    weft.split("**.attn.core", "n", tp, "tp"),
    weft.split("**.attn.c_proj", "k", tp, "tp"),
    weft.split("**.mlp.c_fc", "n", tp, "tp"),
    weft.split("**.mlp.act", "ffn", tp, "tp"),
    weft.split("**.mlp.c_proj", "k", tp, "tp"),
    weft.split("tok", "v", tp, "tp"),
    weft.split("lm_head", "n", tp, "tp"),
    weft.split("loss", "v", tp, "tp"),
    weft.replicate({"emb", "**.ln_1", "**.res_1", "**.ln_2", "**.res_2", "ln_f"}, tp, "tp"),
  }
end

-- megatron(layers, tp, pp, dp, micro_batches): the plan of the strategy
local function megatron(weft, layers, tp, pp, dp, micro_batches)
  local plan = {
    weft.mesh("mg", {{"dp", dp}, {"pp", pp}, {"tp", tp}}),
    tensor_parallel(weft, tp),
    weft.split("all", "batch", dp, "dp"),
    weft.split("all", "batch", micro_batches, "mb", true),
  }
  local per_stage = layers // pp
  for k = 0, pp - 1 do
    local lo, hi = k * per_stage, (k + 1) * per_stage
    local ops = blocks(lo, hi)
    if pp == 1 then
      ops = "all"
    elseif k == 0 then
      ops = {"tok", "emb", blocks(lo, hi)}
    elseif k == pp - 1 then
      ops = {blocks(lo, hi), "ln_f", "lm_head", "loss"}
    end
    plan[#plan + 1] = weft.stage("s" .. k, ops)
  end
  plan[#plan + 1] = weft.assign("all", "mg", {"dp", 0, "tp"})
  for k = 0, pp - 1 do
    plan[#plan + 1] = weft.assign(blocks(k * per_stage, (k + 1) * per_stage), "mg", {"dp", k, "tp"})
  end
  plan[#plan + 1] = weft.assign({"ln_f", "lm_head", "loss"}, "mg", {"dp", pp - 1, "tp"})
  plan[#plan + 1] = weft.schedule("one_f_one_b")
  return plan
end

local function policy(model, cluster, weft)
  local core, tok = operator(model, "h.0.attn.core"), operator(model, "tok")
  if not (model.blocks and model.blocks.name == "h" and core and tok and operator(model, "h.0.attn.c_attn")) then
    print("megatron.lua: model " .. model.name .. " is not the standard gpt model (h.N.attn.c_attn, ...); "
          .. "the plan is left to the search")
    return nil
  end
  local devices, per_node = cluster.devices, cluster.devices_per_node
  local layers, batch = model.blocks.count, model.batch
  -- tensor parallelism: the widest power of two inside a node that the
  -- heads, the vocabulary and the devices divide
  local tp = 1
  while tp * 2 <= per_node and devices % (tp * 2) == 0 and core.sizes.n % (tp * 2) == 0
        and tok.sizes.v % (tp * 2) == 0 do
    tp = tp * 2
  end
  -- what each parameter holds: itself, its gradient, AdamW's two f32 states
  local width = model.parameters[1].bytes // model.parameters[1].elements
  local per_parameter = 2 * width + 8
  -- the fewest pipeline stages that fit: a bound first, then the estimate
  for pp = 1, devices // tp do
    local dp = devices // (tp * pp)
    if (devices // tp) % pp == 0 and layers % pp == 0 and batch % dp == 0
       and model.parameter_count * per_parameter / (tp * pp) <= cluster.device.memory then
      local plan = megatron(weft, layers, tp, pp, dp, batch // dp)
      local figures = weft.estimate(plan)
      if figures and figures.fits then
        return plan
      end
    end
  end
  print("megatron.lua: no Megatron-LM plan of model " .. model.name .. " fits; the plan is left to the search")
  return nil
end

return { policy = policy }
