// The Llama family's hyperparameters in GGUF files, as llama.cpp's convert_hf_to_gguf.py writes
// them for general.architecture `llama` (Llama 2/3 and Mistral) and `qwen2`: {arch}.context_length,
// embedding_length, block_count, feed_forward_length, attention.head_count / head_count_kv /
// key_length / value_length / layer_norm_rms_epsilon, rope.freq_base / dimension_count /
// scaling.type / scaling.factor; Llama 3's rope scaling is no key but the tensor rope_freqs.weight
// (each frequency's divisor), from which the llama3 parameters are recovered and checked. What
// would change the maths and is not implemented (partial rotary, yarn, experts) is refused naming
// the key and its value.
#pragma once

#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "model/gguf.h"
#include "model/gpt_config.h"

namespace paraflow::model {

// The config of a `llama` or `qwen2` file (the vocabulary from token_embd's rows; the head tied
// when the file has no output.weight). Errors name the file and the key or tensor.
GptConfig llama_config_from_gguf(const GgufFile& file, const std::string& architecture);

// The converter's {arch}.* keys for `config` (general.architecture included).
std::vector<std::pair<std::string, GgufValue>> llama_gguf_metadata(const GptConfig& config);

// The converter's rope_freqs.weight for llama3 rope scaling (F32, head_size / 2), else none.
std::optional<Tensor> llama_rope_freqs(const GptConfig& config);

}  // namespace paraflow::model
