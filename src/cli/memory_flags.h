// serve's flags that size memory, checked against the memory this process can still get before
// anything is allocated: too large a value is refused naming the flag, the bytes it asks for and
// the bytes available (it failed later with a bare std::bad_alloc or "out of host memory").
#pragma once

#include <filesystem>

#include "infer/engine.h"

namespace paraflow::cli {

// --kv-cache-gb: the KV cache's blocks take kv_cache_gb GiB.
void check_kv_cache_fits(double kv_cache_gb);

// --max-num-seqs, for the model in `model_dir`: each sequence of a step takes at least its logits
// (vocab_size floats) and its hidden state (n_embd floats).
void check_sequences_fit(const infer::EngineOptions& options, const std::filesystem::path& model_dir);

}  // namespace paraflow::cli
