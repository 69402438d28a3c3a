#include "cli/config_schema.h"

#include <fmt/format.h>

#include "cli/commands.h"

namespace paraflow::cli {

namespace {

using enum ConfigType;

ConfigKey required_count(const char* key, const char* help) {
  return {.key = key, .type = integer, .range = at_least(1), .help = help};
}

}  // namespace

const ConfigSchema& run_config_schema() {
  static const ConfigSchema schema = {
      {.key = "model.architecture", .type = text, .default_value = "gpt2", .choices = {"gpt2", "llama"},
       .help = "gpt2, or llama: RMSNorm, rotary attention with model.n_kv_head k/v heads, a SwiGLU MLP (exported as "
               "Hugging Face's LlamaForCausalLM)"},
      required_count("model.vocab_size", "tokens in the vocabulary (at least the data's largest id + 1)"),
      required_count("model.n_positions", "longest sequence the model accepts (learned position embeddings)"),
      required_count("model.n_embd", "width of the residual stream; a multiple of model.n_head"),
      required_count("model.n_layer", "transformer blocks"),
      required_count("model.n_head", "attention heads per block"),
      {.key = "model.layer_norm_epsilon", .type = number, .default_value = "1e-5", .range = above(0),
       .help = "epsilon of every layernorm"},
      {.key = "model.scale_attn_weights", .type = boolean, .default_value = "true",
       .help = "attention scores x 1/sqrt(head size), as GPT-2's config.json field"},
      {.key = "model.scale_attn_by_inverse_layer_idx", .type = boolean, .default_value = "false",
       .help = "attention scores also x 1/(layer index + 1), as GPT-2's config.json field"},
      {.key = "model.tie_word_embeddings", .type = boolean, .default_value = "true",
       .help = "the head is the token embedding table; false: an lm_head.weight of its own"},
      {.key = "model.n_kv_head", .type = integer, .default_value = "0", .range = at_least(0),
       .help = "llama: key/value heads, dividing model.n_head (grouped-query attention); 0: model.n_head"},
      {.key = "model.head_dim", .type = integer, .default_value = "0", .range = at_least(0),
       .help = "llama: size of each attention head, even; 0: model.n_embd / model.n_head"},
      {.key = "model.intermediate_size", .type = integer, .default_value = "0", .range = at_least(0),
       .help = "llama: width of the SwiGLU MLP (required for llama)"},
      {.key = "model.rope_theta", .type = number, .default_value = "10000", .range = above(0),
       .help = "llama: base of the rotary embeddings' frequencies"},

      {.key = "data.train", .type = text, .help = "a `paraflow data prepare` dir, TFRecord files (dir or glob), or text files", .path = true},
      {.key = "data.format", .type = text, .default_value = "auto", .choices = {"auto", "prepared", "tfrecord", "text"},
       .help = "auto: a dir with manifest.json is `prepared`, TFRecord files are `tfrecord`; byte-level `text` must be asked for"},
      {.key = "data.feature", .type = text, .default_value = "input_ids",
       .help = "format tfrecord: the int64 feature of each tf.train.Example holding token ids"},
      {.key = "data.compression", .type = text, .default_value = "auto", .choices = {"auto", "none", "gzip", "zlib"},
       .help = "format tfrecord: auto detects GZIP/ZLIB from each file's first bytes"},
      {.key = "data.validation", .type = text, .default_value = "",
       .help = "format tfrecord: validation files (dir or glob); none: no evaluation", .path = true},
      {.key = "data.tokenizer", .type = text, .default_value = "", .help = "tokenizer dir copied into exports", .path = true},
      {.key = "data.validation_fraction", .type = number, .default_value = "0.05", .range = {.low = 0, .high = 1, .high_open = true},
       .help = "format text: share of the bytes held out for validation"},

      {.key = "train.batch_size", .type = integer, .default_value = "8", .range = at_least(1),
       .help = "sequences per optimizer step, over all ranks and micro-batches"},
      {.key = "train.sequence_length", .type = integer, .default_value = "256", .range = at_least(1),
       .help = "tokens per sequence (<= model.n_positions)"},
      {.key = "train.steps", .type = integer, .default_value = "1000", .range = at_least(1),
       .help = "optimizer steps; the schedule's length"},
      {.key = "train.stop_at_step", .type = integer, .default_value = "0", .range = at_least(0),
       .help = "> 0: checkpoint and exit at this step (one session of a longer run)"},
      {.key = "train.grad_accumulation", .type = integer, .default_value = "1", .range = at_least(1),
       .help = "micro-batches per step on each rank"},
      {.key = "train.lr", .type = number, .default_value = "6e-4", .range = above(0),
       .help = "peak learning rate (after warm-up)"},
      {.key = "train.min_lr", .type = number, .range = at_least(0),
       .help = "learning rate at the end of the cosine decay; default train.lr / 10; <= train.lr", .optional = true},
      {.key = "train.warmup_steps", .type = integer, .default_value = "0", .range = at_least(0),
       .help = "linear warm-up steps"},
      {.key = "train.beta1", .type = number, .default_value = "0.9", .range = {.low = 0, .high = 1, .high_open = true},
       .help = "AdamW first-moment decay"},
      {.key = "train.beta2", .type = number, .default_value = "0.95", .range = {.low = 0, .high = 1, .high_open = true},
       .help = "AdamW second-moment decay"},
      {.key = "train.eps", .type = number, .default_value = "1e-8", .range = above(0), .help = "AdamW epsilon"},
      {.key = "train.weight_decay", .type = number, .default_value = "0.1", .range = at_least(0),
       .help = "AdamW decoupled weight decay (not on biases, layernorm, embeddings)"},
      {.key = "train.decay_embeddings", .type = boolean, .default_value = "false",
       .help = "apply weight decay to wte/wpe too"},
      {.key = "train.grad_clip", .type = number, .default_value = "1.0", .range = at_least(0),
       .help = "largest global gradient L2 norm; 0 disables clipping"},
      {.key = "train.seed", .type = integer, .default_value = "1337", .range = at_least(0),
       .help = "initialisation and data-order seed"},
      {.key = "train.threads", .type = integer, .default_value = "0", .range = at_least(0),
       .help = "CPU threads per process; 0: all cores"},
      {.key = "train.out_dir", .type = text, .default_value = "runs/default",
       .help = "checkpoints, export, TensorBoard events; one run at a time (locked)", .path = true},
      {.key = "train.checkpoint_every", .type = integer, .default_value = "0", .range = at_least(0),
       .help = "steps between checkpoints; 0: only at the end"},
      {.key = "train.keep_checkpoints", .type = integer, .default_value = "3", .range = at_least(1),
       .help = "newest checkpoints kept"},
      {.key = "train.resume", .type = text, .default_value = "auto", .choices = {"auto", "force"},
       .help = "force: resume even if the checkpoint was made with other model/optimizer settings"},
      {.key = "train.log_every", .type = integer, .default_value = "10", .range = at_least(1),
       .help = "steps between progress lines"},
      {.key = "train.eval_every", .type = integer, .default_value = "0", .range = at_least(0),
       .help = "steps between validation losses; 0: never"},
      {.key = "train.eval_batches", .type = integer, .default_value = "8", .range = at_least(1),
       .help = "validation batches per evaluation"},
      {.key = "train.recompute", .type = text, .default_value = "none",
       .help = "gradient checkpointing: none, block, attention, or comma-separated op kinds"},
      {.key = "train.precision", .type = text, .default_value = "float32",
       .choices = {"float32", "mixed_bfloat16", "mixed_float16"}, .help = "mixed precision policy"},
      {.key = "train.initial_loss_scale", .type = number, .default_value = "32768", .range = at_least(1),
       .help = "mixed_float16: the dynamic loss scale's start"},

      {.key = "dist.bucket_mb", .type = number, .default_value = "25", .range = above(0),
       .help = "gradient all-reduce bucket size (MiB)"},
      {.key = "dist.overlap", .type = boolean, .default_value = "true",
       .help = "all-reduce buckets while backward runs"},
      {.key = "dist.zero", .type = integer, .default_value = "0", .range = between(0, 3),
       .help = "1: ZeRO-1, AdamW state sharded over the replicas; 2: ZeRO-2, gradients too; 3: ZeRO-3, parameters too"},
      {.key = "dist.exact_reduction", .type = boolean, .default_value = "false",
       .help = "sum gradients in fixed point, so results do not depend on ranks x grad_accumulation (not with dist.zero)"},
      {.key = "dist.tensor_parallel", .type = integer, .default_value = "1", .range = at_least(1),
       .help = "shards per layer (heads and MLP split Megatron-style; ranks = shards x stages x replicas)"},
      {.key = "dist.pipeline_parallel", .type = integer, .default_value = "1", .range = at_least(1),
       .help = "pipeline stages per model replica"},
      {.key = "dist.micro_batches", .type = integer, .default_value = "4", .range = at_least(1),
       .help = "pipeline runs: micro-batches per step on each replica (the bubble is (stages-1)/(micro_batches+stages-1))"},
      {.key = "dist.schedule", .type = text, .default_value = "1f1b", .choices = {"gpipe", "1f1b"},
       .help = "pipeline schedule: gpipe holds every micro-batch's activations, 1f1b at most one per later stage"},
      {.key = "dist.stage_layers", .type = text, .default_value = "",
       .help = "blocks per pipeline stage, e.g. \"0,6,6\" (empty: balanced by FLOPs)"},
      {.key = "dist.timeout_seconds", .type = number, .default_value = "60", .range = above(0),
       .help = "how long a rank waits for an unreachable peer before failing"},
      {.key = "dist.ps_mode", .type = text, .default_value = "sync", .choices = {"sync", "async"},
       .help = "TF_CONFIG with ps tasks: sync averages every worker's slice per step; async applies each push"},
      {.key = "dist.max_staleness", .type = integer, .default_value = "4", .range = at_least(0),
       .help = "async ps mode: a push computed on parameters more than this many updates old is rejected"},
      {.key = "dist.tls_cert", .type = text, .default_value = "",
       .help = "ps mode: PEM certificate of every task (gRPC TLS); with dist.tls_key", .path = true},
      {.key = "dist.tls_key", .type = text, .default_value = "", .help = "ps mode: PEM private key of dist.tls_cert", .path = true},
      {.key = "dist.tls_ca", .type = text, .default_value = "",
       .help = "ps mode: PEM CA that signed the certificates (empty: trust dist.tls_cert itself)", .path = true},
      {.key = "dist.auth_token_file", .type = text, .default_value = "",
       .help = "ps mode: a file holding a shared token every call must carry", .path = true},
  };
  return schema;
}

void add_config_command(CLI::App& app) {
  CLI::App* command = app.add_subcommand("config", "About training configs");
  command->require_subcommand(1);
  command->add_subcommand("keys", "Print every config key as a Markdown table (type, default, valid values)")
      ->callback([] { fmt::print("{}", schema_markdown(run_config_schema())); });
}

}  // namespace paraflow::cli
