#include "model/gpt_graph.h"

#include "graph/executor.h"

namespace paraflow::model {

using graph::Attributes;
using graph::OpKind;
using graph::ValueId;
using graph::ValueRole;

GptGraph build_gpt_training_graph(const GptConfig& config, int64_t batch, int64_t sequence) {
  GptGraph g;
  graph::Graph& graph = g.graph;
  for (const TensorSpec& spec : gpt_tensor_specs(config)) {
    g.parameters[spec.name] = graph.add_value(spec.name, spec.shape, DType::f32, ValueRole::parameter);
  }
  auto param = [&](const std::string& name) { return g.parameters.at(name); };
  Attributes layernorm = Attributes().set_float("eps", config.layer_norm_epsilon);
  Attributes linear = Attributes().set("layout", static_cast<int64_t>(WeightLayout::in_out));
  Attributes linear_gelu = Attributes(linear).set("gelu", 1);

  g.tokens = graph.add_value("tokens", Shape{batch, sequence}, DType::i32, ValueRole::input);
  g.targets = graph.add_value("targets", Shape{batch, sequence}, DType::i32, ValueRole::input);
  ValueId x = graph.add_node(OpKind::embedding, "embed", {g.tokens, param("wte.weight"), param("wpe.weight")})[0];

  for (int64_t layer = 0; layer < config.n_layer; ++layer) {
    std::string h = "h." + std::to_string(layer) + ".";
    ValueId ln1 = graph.add_node(OpKind::layernorm, h + "ln_1", {x, param(h + "ln_1.weight"), param(h + "ln_1.bias")},
                                 layernorm)[0];
    ValueId qkv = graph.add_node(OpKind::matmul, h + "attn.c_attn",
                                 {ln1, param(h + "attn.c_attn.weight"), param(h + "attn.c_attn.bias")}, linear)[0];
    ValueId attention =
        graph.add_node(OpKind::attention, h + "attn.core", {qkv}, Attributes().set("n_head", config.n_head))[0];
    ValueId attention_out = graph.add_node(OpKind::matmul, h + "attn.c_proj",
                                           {attention, param(h + "attn.c_proj.weight"), param(h + "attn.c_proj.bias")},
                                           linear)[0];
    ValueId residual1 = graph.add_node(OpKind::add, h + "residual_1", {x, attention_out})[0];
    ValueId ln2 = graph.add_node(OpKind::layernorm, h + "ln_2",
                                 {residual1, param(h + "ln_2.weight"), param(h + "ln_2.bias")}, layernorm)[0];
    ValueId hidden = graph.add_node(OpKind::matmul, h + "mlp.c_fc",
                                    {ln2, param(h + "mlp.c_fc.weight"), param(h + "mlp.c_fc.bias")}, linear_gelu)[0];
    ValueId mlp_out = graph.add_node(OpKind::matmul, h + "mlp.c_proj",
                                     {hidden, param(h + "mlp.c_proj.weight"), param(h + "mlp.c_proj.bias")}, linear)[0];
    x = graph.add_node(OpKind::add, h + "residual_2", {residual1, mlp_out})[0];
  }
  ValueId final_norm =
      graph.add_node(OpKind::layernorm, "ln_f", {x, param("ln_f.weight"), param("ln_f.bias")}, layernorm)[0];
  // Tied head: logits = ln_f(x) · wte^T, reading the embedding table in its [V, C] layout.
  g.logits = graph.add_node(OpKind::matmul, "lm_head", {final_norm, param("wte.weight")},
                            Attributes().set("layout", static_cast<int64_t>(WeightLayout::out_in)))[0];
  g.losses = graph.add_node(OpKind::softmax_xent, "xent", {g.logits, g.targets})[0];
  return g;
}

void bind_parameters(graph::Executor& executor, const GptGraph& graph, const ParameterSet& parameters,
                     const ParameterSet* gradients) {
  for (const auto& [name, id] : graph.parameters) {
    executor.bind(id, parameters.get(name));
    if (gradients != nullptr) {
      graph::ValueId grad = graph.graph.value(id).grad;
      if (grad != graph::kNoValue) executor.bind(grad, gradients->get(name));
    }
  }
}

}  // namespace paraflow::model
