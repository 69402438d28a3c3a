// The mixed-precision policy as a graph pass (Keras' names): with mixed_bfloat16 or
// mixed_float16, every parameter and every activation a forward op produces is stored in 16 bits
// (a cast), and its readers read an f32 copy cast back from that; the loss, the logits and the
// values saved inside an op for its backward stay in f32, as do the master weights and their
// gradients. Gradients flowing back through a cast are rounded to 16 bits the same way. The
// kernels compute in f32 on the CPU.
#pragma once

#include <set>
#include <string>
#include <vector>

#include "backend/backend.h"
#include "graph/graph.h"

namespace paraflow::graph {

enum class PrecisionPolicy { float32, mixed_bfloat16, mixed_float16 };

PrecisionPolicy parse_precision_policy(const std::string& name);  // InputError names the choices
const char* precision_policy_name(PrecisionPolicy policy);
DType storage_dtype(PrecisionPolicy policy);  // f32, bf16 or f16

struct PrecisionPlan {
  // The f32 copies cast back from 16-bit activations, to be given to add_recompute_everywhere
  // after autodiff so that only the 16-bit values live from forward to backward.
  std::vector<int32_t> cast_backs;
  // (f32 parameter, its 16-bit copy): a parameter value of its own that the caller binds to a
  // copy it keeps current (the optimizer writes it with the f32 master weights), and whose
  // gradient it binds to the f32 parameter's gradient, so both readers' gradients add up there.
  std::vector<std::pair<ValueId, ValueId>> half_parameters;
};

// What the graph will run: its forward pass only (decoding), or forward and then backward.
enum class GraphUse { inference, training };

// Run on the forward graph, before autodiff. Values in `keep_f32` are left alone. An op reads a
// 16-bit value directly where it accepts one and `backend` has its kernels in that type (the
// forward kernels only, for inference); other readers of an activation get an f32 copy, other
// readers of a parameter the f32 parameter. `stored_inputs` are f32 inputs treated like
// activations (a pipeline stage's residual stream received from the previous stage), so that ops
// mixing them with activations see one type.
PrecisionPlan apply_precision_policy(Graph& graph, PrecisionPolicy policy, GraphUse use,
                                     const std::set<ValueId>& keep_f32, const Backend& backend,
                                     const std::set<ValueId>& stored_inputs = {});

// Decoding with 16-bit or quantized weights and f32 activations (generate's and serve's float16,
// q8_0, q4_k): every forward matmul reads its weight parameter from a copy in `dtype` (a parameter
// value of its own, returned as in PrecisionPlan::half_parameters, which the caller binds); q4_k
// as llama.cpp falls back where the matmul's input rows are not whole super-blocks
// (quantized_type_for_rows: q5_0). Nothing else changes.
PrecisionPlan read_matmul_weights_in(Graph& graph, DType dtype);

}  // namespace paraflow::graph
