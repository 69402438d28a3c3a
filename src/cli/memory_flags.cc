#include "cli/memory_flags.h"

#include <fmt/format.h>

#include "base/error.h"
#include "base/file_io.h"
#include "base/json.h"
#include "base/system_memory.h"
#include "model/gpt_config.h"

namespace paraflow::cli {

namespace {

void check_fits(const std::string& flag, double bytes, const std::string& what) {
  const int64_t available = available_memory_bytes();
  constexpr double kGiB = 1024.0 * 1024 * 1024;
  check(bytes <= static_cast<double>(available), "{}: {} {:.0f} bytes ({:.4g} GiB); {} bytes ({:.1f} GiB) of memory are available",
        flag, what, bytes, bytes / kGiB, available, static_cast<double>(available) / kGiB);
}

}  // namespace

void check_kv_cache_fits(double kv_cache_gb) {
  check_fits(fmt::format("--kv-cache-gb {:g}", kv_cache_gb), kv_cache_gb * 1024 * 1024 * 1024,
             "the KV cache asks for");
}

void check_sequences_fit(const infer::EngineOptions& options, const std::filesystem::path& model_dir) {
  const std::filesystem::path path = model_dir / "config.json";
  if (!std::filesystem::exists(path)) return;  // loading the model says so
  const model::GptConfig config = model::GptConfig::from_hf_json(parse_json(read_file(path), path.string()), path.string());
  const double per_sequence = 4.0 * static_cast<double>(config.vocab_size + config.n_embd);
  check_fits(fmt::format("--max-num-seqs {}", options.max_num_seqs),
             static_cast<double>(options.max_num_seqs) * per_sequence,
             fmt::format("{} sequences' logits and hidden states ((vocab {} + n_embd {}) x 4 bytes each) take at least",
                         options.max_num_seqs, config.vocab_size, config.n_embd));
}

}  // namespace paraflow::cli
