// Each subcommand registers itself on the CLI11 app and runs from its callback.
#pragma once

#include <CLI/CLI.hpp>

#include <charconv>
#include <cmath>
#include <exception>
#include <limits>
#include <string>

#include "backend/backend.h"
#include "base/config.h"
#include "base/error.h"
#include "graph/op.h"

namespace paraflow::cli {

void add_train_command(CLI::App& app);
void add_generate_command(CLI::App& app);
void add_eval_command(CLI::App& app);
void add_tokenizer_command(CLI::App& app);
void add_data_command(CLI::App& app);
void add_plan_command(CLI::App& app);
void add_config_command(CLI::App& app);
void add_serve_command(CLI::App& app);
void add_quantize_command(CLI::App& app);

// A CLI11 check that an option's value is a finite number in `range`, refusing others with a
// message naming the value and the range ("--ranks: 0 must be >= 1"; "inf" and "nan" too).
inline CLI::Validator in_range(const Range& range) {
  return CLI::Validator(
      [range](std::string& text) -> std::string {
        size_t used = 0;
        double value = 0;
        try {
          value = std::stod(text, &used);
        } catch (const std::exception&) {
          used = 0;
        }
        if (used == 0 || used != text.size()) return fmt::format("'{}' is not a number", text);
        if (!std::isfinite(value)) return fmt::format("{} is not a finite number", text);
        return range.contains(value) ? "" : fmt::format("{} must be {}", text, range.describe());
      },
      "NUMBER " + range.describe());
}

// --config of train, eval and plan, also accepted as the command's argument: `paraflow train my.yaml`.
// Required unless the command has another way in (eval's --model).
inline CLI::Option* add_config_option(CLI::App* command, std::string& path, const std::string& description,
                                      bool required = true) {
  return command
      ->add_option("config,--config", path, description + " (--config may be left out: `" + command->get_name() + " my.yaml`)")
      ->required(required)
      ->check(CLI::ExistingFile);
}

// A CLI11 check for an unsigned 64-bit option (a seed): decimal digits in [0, 2^64 - 1]. (CLI11
// alone would wrap -1 and saturate 999999999999999999999, both to 2^64 - 1.)
inline CLI::Validator unsigned_64() {
  return CLI::Validator(
      [](std::string& text) -> std::string {
        uint64_t value = 0;
        const auto [end, error] = std::from_chars(text.data(), text.data() + text.size(), value);
        if (error == std::errc() && end == text.data() + text.size()) return "";
        return fmt::format("{} is not an integer in [0, {}]", text, std::numeric_limits<uint64_t>::max());
      },
      "INTEGER in [0, 2^64-1]");
}

// --dtype of generate and serve: float32, bfloat16, float16, q8_0 or q4_k on request; by default the 16-bit
// weights whose products the backend runs fastest: bfloat16 where it stores them as tiles (AMX,
// or AVX512_BF16 pair products where those run at the f32 FMA rate: AMD's Zen 4), else float16
// where it multiplies half natively (AVX512_FP16: half FMAs do twice the multiply-adds of f32
// ones per instruction, where Intel's AVX512_BF16 dot products run at half the f32 rate;
// bench/RESULTS.md), else bfloat16 where the backend has bf16 GEMMs, the same test as
// training's (the bf16 decoding forward alone runs on any CPU); else float32.
inline DType weights_dtype(const std::string& choice, const Backend& backend) {
  if (choice == "float32") return DType::f32;
  if (choice == "bfloat16") return DType::bf16;
  if (choice == "float16") return DType::f16;
  if (choice == "q8_0") return DType::q8_0;
  if (choice == "q4_k") return DType::q4_k;
  if (backend.prefers_tiled_weights(DType::bf16)) return DType::bf16;
  if (backend.multiplies_f16_natively()) return DType::f16;
  return backend.multiplies_bf16_natively() ? DType::bf16 : DType::f32;
}

// --kv-cache-dtype of generate and serve: float32 or bfloat16 on request; auto follows the weights
// (bf16 weights make keys and values that are bf16 values already, which a bf16 cache holds
// exactly), and float16, q8_0 and q4_k weights take a bfloat16 cache (their f32 keys and values
// rounded; half the bytes, as with bf16 weights).
inline DType kv_cache_dtype(const std::string& choice, DType weights) {
  if (choice == "float32") return DType::f32;
  if (choice == "bfloat16") return DType::bf16;
  return weights == DType::f16 || is_block_quantized(weights) ? DType::bf16 : weights;
}

// Registers --dtype (weights_dtype's choice) on generate, serve and eval --model.
inline CLI::Option* add_weights_dtype_option(CLI::App* command, std::string& dtype) {
  return command->add_option("--dtype", dtype,
                      "Weights in float32, bfloat16, float16 (the linear layers' weights only, in half arithmetic on CPUs with "
                      "AVX512_FP16) or q8_0 (the linear layers' and the head's weights quantized at load to 8 bits in blocks of 32, "
                      "as GGUF's Q8_0) or q4_k (the same in 4 bits, super-blocks of 256 with 6-bit scales and minimums, as GGUF's "
                      "Q4_K; Q5_0 where rows are not whole super-blocks, as llama.cpp falls back); auto: bfloat16 with AMX or on AMD with AVX512_BF16, else float16 with AVX512_FP16, else "
                      "bfloat16 with AVX512_BF16, else float32")
      ->capture_default_str()
      ->check(CLI::IsMember({"auto", "float32", "bfloat16", "float16", "q8_0", "q4_k"}));
}

inline const char* dtype_word(DType dtype) {
  if (is_block_quantized(dtype)) return dtype_name(dtype);
  return dtype == DType::bf16 ? "bfloat16" : dtype == DType::f16 ? "float16" : "float32";
}

// The exit status for an error: 1 for bad input (paraflow::InputError), 2 for anything else.
inline int exit_status(const std::exception& error) { return dynamic_cast<const InputError*>(&error) ? 1 : 2; }

}  // namespace paraflow::cli
