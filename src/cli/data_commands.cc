// `paraflow tokenizer train|encode|decode` and `paraflow data prepare`.
#include <fmt/format.h>

#include <algorithm>
#include <charconv>
#include <iostream>
#include <iterator>
#include <memory>

#include "base/error.h"
#include "cli/commands.h"
#include "data/prepare.h"
#include "data/tokenizer.h"
#include "data/tokenizer_train.h"

namespace paraflow::cli {

namespace {

struct TokenizerTrainOptions {
  std::vector<std::string> inputs;
  std::string out;
  std::string text_field = "text";
  std::string separator = "blank-line";
  int vocab_size = 8192;
  int threads = 0;
};

void run_tokenizer_train(const TokenizerTrainOptions& options) {
  data::BpeTrainOptions train_options;
  train_options.vocab_size = options.vocab_size;
  train_options.threads = options.threads;
  data::BpeTrainer trainer(train_options);
  int64_t documents = 0;
  // Documents are counted in batches of about 64 MiB on --threads threads (the counts, and so
  // the tokenizer, do not depend on the batching).
  constexpr size_t kBatchBytes = 64 << 20;
  std::vector<std::string> batch;
  size_t batch_bytes = 0;
  auto count_batch = [&] {
    const std::vector<std::string_view> views(batch.begin(), batch.end());
    trainer.add_texts(views);
    batch.clear();
    batch_bytes = 0;
  };
  const data::DocumentSeparator separator = data::DocumentSeparator::parse(options.separator);
  for (const auto& path : data::expand_inputs(options.inputs)) {
    data::for_each_document(
        path, options.text_field, separator,
        [&](std::string_view text) {
          batch.emplace_back(text);
          batch_bytes += text.size();
          ++documents;
          if (batch_bytes >= kBatchBytes) count_batch();
        },
        [](std::string message) -> bool { throw InputError(message); });
  }
  count_batch();
  data::Tokenizer tokenizer = trainer.train();
  tokenizer.save(options.out);
  fmt::print(stderr, "trained a {}-token byte-level BPE on {} documents ({} distinct words) -> {}\n",
             tokenizer.vocab_size(), documents, trainer.distinct_words(), options.out);
}

// Decimal ids separated by commas and/or whitespace, optionally in brackets: "7,8", "7 8", "[7, 8]"
// (as `tokenizer encode` and Python print them). Anything else ('12abc', '1.5', '0x10', '7;8') is
// refused, naming the token.
std::vector<data::TokenId> parse_ids(const std::string& text) {
  constexpr const char* kSeparators = ", \t\n";
  std::string_view list = text;
  const size_t open = list.find_first_not_of(kSeparators);
  const size_t close = list.find_last_not_of(kSeparators);
  if (open != std::string_view::npos && list[open] == '[' && list[close] == ']') {
    list = list.substr(open + 1, close - open - 1);
  }
  std::vector<data::TokenId> ids;
  size_t position = 0;
  while (true) {
    position = list.find_first_not_of(kSeparators, position);
    if (position == std::string_view::npos) break;
    const size_t end = std::min(list.find_first_of(kSeparators, position), list.size());
    const std::string_view item = list.substr(position, end - position);
    data::TokenId id = 0;
    auto [stop, error] = std::from_chars(item.data(), item.data() + item.size(), id);
    check(error == std::errc() && stop == item.data() + item.size(),
          "--ids: '{}' is not a decimal token id (the ids are separated by commas or spaces: '7,8', '7 8' or "
          "'[7, 8]')", item);
    ids.push_back(id);
    position = end;
  }
  return ids;
}

struct PrepareCommandOptions {
  data::PrepareOptions prepare;
  double shard_mb = 64;
  std::string compression = "none";
  std::string on_bad_line = "fail";
  std::string separator = "blank-line";
};

// --document-separator, as `tokenizer train` and `data prepare` read it (the same documents).
void add_separator_option(CLI::App* command, std::string& separator) {
  command
      ->add_option("--document-separator", separator,
                   "How .txt files are cut into documents: blank-line, none (a file is one document), or a text "
                   "(escapes \\n \\t \\r \\\\)")
      ->capture_default_str();
}

}  // namespace

void add_tokenizer_command(CLI::App& app) {
  CLI::App* command = app.add_subcommand("tokenizer", "Train, apply and invert a byte-level BPE tokenizer");
  command->require_subcommand(1);

  auto train = std::make_shared<TokenizerTrainOptions>();
  CLI::App* train_command = command->add_subcommand("train", "Train a vocabulary (writes vocab.json, merges.txt, tokenizer.json)");
  train_command->add_option("--input", train->inputs, "Globs of .txt / .jsonl / .jsonl.gz files")->required();
  train_command->add_option("--out", train->out, "Output directory")->required();
  train_command->add_option("--vocab-size", train->vocab_size, "Tokens, including the 256 bytes and <|endoftext|>")
      ->capture_default_str()
      ->check(in_range(between(257, 1 << 24)));
  train_command->add_option("--text-field", train->text_field, "JSON field holding the text")->capture_default_str();
  add_separator_option(train_command, train->separator);
  train_command->add_option("--threads", train->threads, "Threads for counting words (0 = all)")
      ->check(in_range(at_least(0)));
  train_command->callback([train] { run_tokenizer_train(*train); });

  auto tokenizer_dir = std::make_shared<std::string>();
  auto text = std::make_shared<std::string>();
  CLI::App* encode = command->add_subcommand("encode", "Print the ids of --text (or standard input)");
  encode->add_option("--tokenizer", *tokenizer_dir, "Tokenizer directory")->required()->check(CLI::ExistingDirectory);
  CLI::Option* text_option = encode->add_option("--text", *text, "Text to encode (default: standard input)");
  encode->callback([tokenizer_dir, text, text_option] {
    data::Tokenizer tokenizer = data::Tokenizer::load(*tokenizer_dir);
    std::string input = text_option->count() ? *text : std::string(std::istreambuf_iterator<char>(std::cin), {});
    std::vector<data::TokenId> ids = tokenizer.encode(input);
    fmt::print("{}\n", fmt::join(ids, ","));
  });

  auto ids = std::make_shared<std::string>();
  CLI::App* decode = command->add_subcommand("decode", "Print the text of token ids (as `tokenizer encode` prints them), with no newline added");
  decode->add_option("--tokenizer", *tokenizer_dir, "Tokenizer directory")->required()->check(CLI::ExistingDirectory);
  decode->add_option("--ids", *ids, "Decimal token ids separated by commas and/or spaces, optionally in brackets: '7,8', '7 8', '[7, 8]'")->required();
  decode->callback([tokenizer_dir, ids] {
    data::Tokenizer tokenizer = data::Tokenizer::load(*tokenizer_dir);
    std::vector<data::TokenId> parsed = parse_ids(*ids);
    for (data::TokenId id : parsed) {
      check(id >= 0 && id < tokenizer.vocab_size(), "--ids: {} is outside the vocabulary of {}", id,
            tokenizer.vocab_size());
    }
    fmt::print("{}", tokenizer.decode(parsed));
  });
}

void add_data_command(CLI::App& app) {
  CLI::App* command = app.add_subcommand("data", "Prepare training data");
  command->require_subcommand(1);
  auto options = std::make_shared<PrepareCommandOptions>();
  CLI::App* prepare = command->add_subcommand(
      "prepare", "Tokenize text into TFRecord shards of tf.train.Example{input_ids} with a train/val split");
  prepare->add_option("--tokenizer", options->prepare.tokenizer, "Tokenizer directory")->required()->check(CLI::ExistingDirectory);
  prepare->add_option("--input", options->prepare.inputs, "Globs of .txt / .jsonl / .jsonl.gz files")->required();
  prepare->add_option("--out", options->prepare.out, "Output directory")->required();
  prepare->add_option("--val-fraction", options->prepare.val_fraction, "Share of documents for validation")
      ->capture_default_str();
  prepare->add_option("--text-field", options->prepare.text_field, "JSON field holding the text")->capture_default_str();
  add_separator_option(prepare, options->separator);
  prepare->add_option("--shard-mb", options->shard_mb, "Shard size bound")->capture_default_str()->check(in_range(above(0)));
  prepare->add_option("--compression", options->compression, "none | gzip | zlib")->capture_default_str();
  prepare->add_option("--on-bad-line", options->on_bad_line, "fail | skip")->capture_default_str();
  prepare->add_option("--seed", options->prepare.seed, "Split seed")->capture_default_str()->check(unsigned_64());
  prepare->add_option("--threads", options->prepare.threads, "Threads (0 = all)")->check(in_range(at_least(0)));
  prepare->callback([options] {
    options->prepare.shard_bytes = static_cast<int64_t>(options->shard_mb * (1 << 20));
    options->prepare.compression = data::parse_compression(options->compression);
    options->prepare.on_bad_line = data::parse_bad_line_policy(options->on_bad_line);
    options->prepare.separator = data::DocumentSeparator::parse(options->separator);
    nlohmann::json manifest = data::prepare(options->prepare);
    const auto& splits = manifest.at("splits");
    fmt::print(stderr, "prepared {}: train {} documents / {} tokens, val {} documents / {} tokens\n",
               options->prepare.out.string(), splits["train"].value("documents", int64_t{0}),
               splits["train"].value("tokens", int64_t{0}), splits["val"].value("documents", int64_t{0}),
               splits["val"].value("tokens", int64_t{0}));
  });
}

}  // namespace paraflow::cli
