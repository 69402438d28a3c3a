// Checkpoint save and restore time on one process: the sharded format (CheckpointManager: slices
// written one at a time with their index, checksums read back in blocks; restore maps the slices)
// against the single-file format that checkpoints had before (the whole model and both moments
// serialised in memory, written, then read back whole for the manifest; restore reads each file
// whole), on the same model and disk, in one run. Prints the machine, both times and the ratios.
//
//   build/bench/train/checkpoint_bench --n-embd 768 --n-layer 6 --repeats 3 --dir /tmp/ckpt-bench
#include <fmt/format.h>

#include <CLI/CLI.hpp>
#include <chrono>

#include "backend/cpu/gemm.h"
#include "base/file_io.h"
#include "model/model_files.h"
#include "model/safetensors.h"
#include "train/checkpoint.h"
#include "machine.h"

using namespace paraflow;

namespace {

double seconds(const std::function<void()>& work) {
  const auto start = std::chrono::steady_clock::now();
  work();
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
}

// The single-file checkpoint as it was written before sharding (train/checkpoint.cc at 1f66dd8).
void save_single_file(const std::filesystem::path& dir, const model::GptConfig& config,
                      const model::ParameterSet& weights, const model::ParameterSet& first,
                      const model::ParameterSet& second) {
  std::filesystem::create_directories(dir);
  model::save_model_dir(dir, config, weights);
  std::vector<std::pair<std::string, Tensor>> moments;
  for (size_t i = 0; i < weights.specs().size(); ++i) {
    moments.emplace_back("m." + weights.specs()[i].name, first.at(i));
    moments.emplace_back("v." + weights.specs()[i].name, second.at(i));
  }
  write_file_atomic(dir / "optimizer.safetensors", model::serialize_safetensors(moments));
  write_file_atomic(dir / "state.json", "{\"step\": 1, \"optimizer_steps\": 1}\n");
  nlohmann::json manifest = {{"step", 1}, {"files", nlohmann::json::object()}};
  for (const char* name : {"config.json", "model.safetensors", "optimizer.safetensors", "state.json"}) {
    const std::string content = read_file(dir / name);
    manifest["files"][name] = {{"bytes", content.size()}, {"crc32c", crc32c(content.data(), content.size())}};
  }
  write_file_atomic(dir / "manifest.json", manifest.dump(2) + "\n");
}

// Its restore before sharding: verify (each file read whole), then each safetensors file read whole.
void load_single_file(const std::filesystem::path& dir, model::ParameterSet& weights, model::ParameterSet& first,
                      model::ParameterSet& second) {
  train::CheckpointManager::verify(dir);
  model::SafetensorsFile stored = model::SafetensorsFile::load((dir / "model.safetensors").string());
  for (const auto& [name, tensor] : model::hf_tensors(weights)) stored.read_into(name, tensor);
  model::SafetensorsFile moments = model::SafetensorsFile::load((dir / "optimizer.safetensors").string());
  for (size_t i = 0; i < weights.specs().size(); ++i) {
    moments.read_into("m." + weights.specs()[i].name, first.at(i));
    moments.read_into("v." + weights.specs()[i].name, second.at(i));
  }
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"checkpoint save/restore: sharded vs single-file"};
  int64_t n_embd = 768, n_layer = 6, vocab = 50304;
  int repeats = 3;
  std::string dir = "/tmp/paraflow-checkpoint-bench";
  app.add_option("--n-embd", n_embd);
  app.add_option("--n-layer", n_layer);
  app.add_option("--vocab-size", vocab);
  app.add_option("--repeats", repeats);
  app.add_option("--dir", dir, "where the checkpoints are written (removed at the end)");
  CLI11_PARSE(app, argc, argv);

  model::GptConfig config;
  config.vocab_size = vocab;
  config.n_positions = 1024;
  config.n_embd = n_embd;
  config.n_layer = n_layer;
  config.n_head = n_embd / 64;
  const std::vector<model::TensorSpec> specs = model::gpt_tensor_specs(config);
  model::ParameterSet weights(specs, cpu_backend()), first(specs, cpu_backend()), second(specs, cpu_backend());
  model::initialize_gpt(weights, config, 1);
  model::initialize_gpt(first, config, 2);
  model::initialize_gpt(second, config, 3);
  const double mib = 12.0 * static_cast<double>(weights.numel()) / (1 << 20);
  fmt::print("cpu: {}\nonednn_isa: {}\nmodel: {} parameters; a checkpoint holds {:.0f} MiB (weights + 2 moments, f32)\n",
             bench::cpu_model(), cpu::onednn_isa_name(), weights.numel(), mib);

  const std::filesystem::path root = dir;
  std::filesystem::remove_all(root);
  train::CheckpointManager manager(root / "sharded", 1);
  double best[4] = {1e30, 1e30, 1e30, 1e30};  // sharded save, load; single-file save, load
  for (int repeat = 0; repeat < repeats; ++repeat) {
    std::filesystem::path saved;
    best[0] = std::min(best[0], seconds([&] {
      saved = manager.save(1, config, weights, first.flat(), second.flat(), 1, nlohmann::json::object());
    }));
    best[1] = std::min(best[1], seconds([&] {
      train::CheckpointManager::verify(saved);
      train::CheckpointManager::load(saved, config, weights, first.flat(), second.flat());
    }));
    const std::filesystem::path single = root / fmt::format("single-{}", repeat);
    best[2] = std::min(best[2], seconds([&] { save_single_file(single, config, weights, first, second); }));
    best[3] = std::min(best[3], seconds([&] { load_single_file(single, weights, first, second); }));
    std::filesystem::remove_all(single);
  }
  std::filesystem::remove_all(root);
  fmt::print("best of {}      sharded (ours)   single-file (before)   before / ours\n", repeats);
  fmt::print("save             {:8.3f} s       {:8.3f} s             {:.2f}x\n", best[0], best[2], best[2] / best[0]);
  fmt::print("verify + load    {:8.3f} s       {:8.3f} s             {:.2f}x\n", best[1], best[3], best[3] / best[1]);
  return 0;
}
