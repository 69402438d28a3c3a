#include <fmt/format.h>
#include <omp.h>

#include <memory>

#include "cli/commands.h"
#include "cli/stop_signal.h"
#include "cli/run_setup.h"
#include "base/file_io.h"
#include "infer/generator.h"
#include "infer/model_source.h"
#include "train/evaluator.h"

namespace paraflow::cli {

namespace {

struct EvalOptions {
  std::string config_path;
  std::vector<std::string> overrides;
  std::string checkpoint;
  std::string watch;
  int threads = 0;
  // A model directory's perplexity on a text file, with its weights in --dtype.
  std::string model_dir, text_path, dtype = "float32";
  int64_t context = 0;  // 0: the model's n_positions
  bool score_second_half = false;  // llama-perplexity's scoring
};

// The perplexity of a model directory on a text file: the text tokenized with the model's
// tokenizer, run in windows of the context (model::use_weights_for_decoding's weights, as
// generate decodes them), every token but a window's first scored, or, with --score-second-half,
// the second half of each whole window (llama-perplexity's tokens: infer::perplexity).
void run_text_perplexity(const EvalOptions& options) {
  Backend& backend = cpu_backend();
  const DType weights = weights_dtype(options.dtype, backend);
  const infer::ModelSource source = infer::load_model_source(options.model_dir, backend);
  const model::LoadedModel& model = source.model;
  const std::vector<int32_t> tokens = source.codec.encode(read_file(options.text_path));
  const int64_t context = options.context > 0 ? options.context : model.config.n_positions;
  const int64_t least = options.score_second_half ? 3 : 2;  // to score one token
  check(context >= least && context <= model.config.n_positions,
        "--context {}: a window must hold {} tokens at least (one to score) and the model's context {} at most", context,
        least, model.config.n_positions);
  check(!options.score_second_half || tokens.size() >= static_cast<size_t>(context),
        "--text {}: {} tokens, not one whole window of --context {} (--score-second-half scores whole windows only)",
        options.text_path, tokens.size(), context);
  check(tokens.size() >= 2, "--text {}: {} token(s); two at least are needed to score one", options.text_path,
        tokens.size());
  infer::Generator generator(model.config, model.parameters, backend, weights);
  const infer::Perplexity result = infer::perplexity(generator, tokens, context, options.score_second_half);
  fmt::print("perplexity {:.4f} | mean nll {:.5f} | {} weights | {} tokens scored in {} windows of {}\n",
             result.perplexity, result.mean_nll, dtype_word(weights), result.scored, result.windows, context);
}

void run_eval(const EvalOptions& options) {
  if (!options.model_dir.empty()) {
    if (options.threads > 0) omp_set_num_threads(options.threads);
    run_text_perplexity(options);
    return;
  }
  RunSetup setup = RunSetup::load(options.config_path, options.overrides);
  int threads = options.threads > 0 ? options.threads : setup.threads;
  if (threads > 0) omp_set_num_threads(threads);
  std::unique_ptr<train::BatchSource> data = setup.open_data();
  train::Evaluator evaluator(setup.model, *data, cpu_backend(), setup.train);
  if (!options.watch.empty()) {
    const std::atomic<bool>* stop = stop_requests("finishing this evaluation");
    fmt::print(stderr, "evaluator: watching {} for checkpoints up to step {}\n", options.watch, setup.train.steps);
    evaluator.watch(options.watch, setup.train.steps, stop);
    return;
  }
  train::EvalResult result = evaluator.evaluate_dir(options.checkpoint);
  fmt::print("val loss {:.4f} | perplexity {:.3f} | {} batches of {}x{}\n", result.loss, result.perplexity,
             setup.train.eval_batches, setup.train.batch_size, setup.train.sequence_length);
}

}  // namespace

void add_eval_command(CLI::App& app) {
  auto options = std::make_shared<EvalOptions>();
  CLI::App* command = app.add_subcommand(
      "eval", "Evaluate a checkpoint on the validation split, or follow a run, or a model's perplexity on a text file");
  auto* config = add_config_option(command, options->config_path, "The run's YAML config", false);
  command->add_option("--set", options->overrides, "Override a config key (repeatable)");
  auto* checkpoint = command->add_option("--checkpoint", options->checkpoint, "A checkpoint or export dir")
                         ->check(CLI::ExistingDirectory);
  auto* watch = command->add_option("--watch", options->watch,
                                    "A run dir (train.out_dir, which must exist): evaluate each new checkpoint, TensorBoard "
                                    "summaries in <dir>/eval")
                    ->check(CLI::ExistingDirectory);
  checkpoint->excludes(watch);
  auto* model = command->add_option("--model", options->model_dir,
                                    "A model dir (an export: Hugging Face files) or a GGUF file (GPT-2, Llama, Mistral, Qwen2): its perplexity on --text")
                    ->check(CLI::ExistingPath)
                    ->excludes(config)
                    ->excludes(checkpoint)
                    ->excludes(watch);
  auto* text = command->add_option("--text", options->text_path, "A UTF-8 text file (with --model)")
                   ->check(CLI::ExistingFile)
                   ->needs(model);
  model->needs(text);
  add_weights_dtype_option(command, options->dtype)->needs(model);
  command->add_option("--context", options->context, "With --model: tokens per window (default: the model's context)")
      ->check(in_range(at_least(0)))
      ->needs(model);
  command->add_flag("--score-second-half", options->score_second_half,
                    "With --model: score only the second half of each whole window, the first --context/2 tokens "
                    "context only, as llama.cpp's llama-perplexity does (the same tokens as its -c --context)")
      ->needs(model);
  command->add_option("--threads", options->threads, "CPU threads (default: all cores)")->check(in_range(at_least(0)));
  command->callback([options] {
    if (!options->model_dir.empty()) {
      run_eval(*options);
      return;
    }
    if (options->config_path.empty()) throw CLI::ValidationError("give a config (or --model and --text)");
    if (options->checkpoint.empty() && options->watch.empty()) throw CLI::ValidationError("give --checkpoint or --watch");
    run_eval(*options);
  });
}

}  // namespace paraflow::cli
