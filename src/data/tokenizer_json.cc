// Hugging Face's tokenizer.json: the BPE models of GPT-2, Llama 3, Qwen2 (byte-level) and of
// Llama 2, Mistral (SentencePiece-style, byte fallback), with their normalizers, pre-tokenizers,
// decoders, post-processors and added tokens. What those files hold is recognised component by
// component; anything else would change the ids, so it is refused naming the field and its value.
#include <nlohmann/json.hpp>

#include <fmt/format.h>

#include <algorithm>

#include "base/error.h"
#include "data/tokenizer.h"
#include "data/tokenizer_vocab.h"

namespace paraflow::data {
namespace {

namespace fs = std::filesystem;
using nlohmann::json;

// The split patterns of Llama 3 (tiktoken's cl100k pattern) and Qwen2, as their files spell them.
constexpr std::string_view kLlama3Pattern =
    R"((?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+)";
constexpr std::string_view kQwen2Pattern =
    R"((?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+)";

// Reads one tokenizer.json; `where` is its path, every error names it and the JSON field.
class JsonReader {
 public:
  JsonReader(const fs::path& path, const fs::path& tokenizer_config)
      : where_(path.string()), j_(parse_json_file(path)), config_path_(tokenizer_config) {
    check(j_.is_object() && j_.contains("model") && j_["model"].is_object(), "{}: no \"model\" object", where_);
  }

  Tokenizer read() {
    read_model_options();
    read_normalizer_and_pre_tokenizer();
    read_decoder();
    read_added_tokens();
    const json& model = j_["model"];
    check(model.contains("vocab"), "{}: model.vocab is missing", where_);
    Vocab v = read_vocab(model["vocab"], where_ + ": model.vocab", added_texts_,
                         options_.sentencepiece ? Spelling::kMetaspace : Spelling::kByteLevel);
    place_added_tokens(v);
    // GPT-2's `<|endoftext|>` is special even where added_tokens does not list it.
    for (TokenId id : v.special_ids) {
      if (std::none_of(added_.begin(), added_.end(), [&](const AddedToken& a) { return a.id == id; })) {
        added_.push_back({.id = id});
      }
    }
    if (options_.sentencepiece && byte_fallback_) options_.byte_fallback = v.byte_fallback;
    if (!unk_token_.empty()) {
      auto it = v.by_string.find(unk_token_);
      check(it != v.by_string.end(), "{}: model.unk_token \"{}\" is not in the vocabulary", where_, unk_token_);
      options_.unk_id = it->second;
    }
    read_post_processor(v);
    read_llama_config(v);
    std::vector<std::pair<TokenId, TokenId>> merges = read_merges(v);
    try {
      return Tokenizer(std::move(v.tokens), std::move(merges), std::move(added_), std::move(options_));
    } catch (const InputError& e) {
      fail("{}: {}", where_, e.what());
    }
  }

 private:
  static std::string type_of(const json& component) {
    if (component.is_object()) return component.value("type", std::string("?"));
    return component.type_name();
  }
  std::string str(const json& object, const char* key) const {
    const json& value = object.value(key, json());
    return value.is_string() ? value.get<std::string>() : std::string();
  }
  [[noreturn]] void refuse(const std::string& field, const json& value, std::string_view why) const {
    std::string shown = value.dump();
    if (shown.size() > 300) shown = shown.substr(0, 300) + "...";
    fail("{}: {} = {} is not supported ({})", where_, field, shown, why);
  }

  void read_model_options() {
    const json& model = j_["model"];
    const std::string type = model.value("type", std::string("BPE"));
    if (type != "BPE") refuse("model.type", type, "only BPE models are; WordPiece, Unigram and WordLevel are not");
    if (!model.value("dropout", json()).is_null() && model["dropout"] != 0) {
      refuse("model.dropout", model["dropout"], "sampling merges makes ids random");
    }
    if (!str(model, "continuing_subword_prefix").empty()) {
      refuse("model.continuing_subword_prefix", model["continuing_subword_prefix"], "BPE of whole words only");
    }
    if (!str(model, "end_of_word_suffix").empty()) {
      refuse("model.end_of_word_suffix", model["end_of_word_suffix"], "BPE of whole words only");
    }
    options_.ignore_merges = model.value("ignore_merges", false);
    options_.fuse_unk = model.value("fuse_unk", false);
    byte_fallback_ = model.value("byte_fallback", false);
    unk_token_ = str(model, "unk_token");
  }

  // The families: byte-level (pre-tokenizer ByteLevel, alone as GPT-2's or after a Split by
  // Llama 3's or Qwen2's pattern; normalizer none or NFC) and SentencePiece-style (normalizer
  // Prepend("▁") + Replace(" ", "▁"), or pre-tokenizer Metaspace).
  void read_normalizer_and_pre_tokenizer() {
    const json& normalizer = j_.value("normalizer", json());
    const json& pre = j_.value("pre_tokenizer", json());
    if (!pre.is_null() && type_of(pre) == "Metaspace") {
      options_.sentencepiece = true;
      read_metaspace(pre, "pre_tokenizer");
    } else if (pre.is_null() && !normalizer.is_null() && type_of(normalizer) == "Sequence") {
      options_.sentencepiece = true;
    } else {
      read_byte_level_pre_tokenizer(pre);
    }
    if (options_.sentencepiece) {
      options_.pre_tokenizer = PreTokenizer::kWhole;
      if (!normalizer.is_null()) read_sentencepiece_normalizer(normalizer);
      if (!byte_fallback_ && unk_token_.empty()) {
        refuse("model.byte_fallback", false, "a SentencePiece-style model needs byte_fallback or an unk_token");
      }
    } else {
      if (byte_fallback_) refuse("model.byte_fallback", true, "byte-level BPE has a token for every byte");
      if (!normalizer.is_null()) {
        if (type_of(normalizer) != "NFC") refuse("normalizer", normalizer, "byte-level BPE takes none or NFC");
        options_.nfc = true;
      }
    }
  }

  void read_byte_level(const json& pre, const std::string& field, bool use_regex) {
    if (type_of(pre) != "ByteLevel") refuse(field, pre, "expected ByteLevel");
    if (pre.value("add_prefix_space", false)) refuse(field + ".add_prefix_space", true, "no family uses it");
    if (pre.value("use_regex", true) != use_regex) {
      refuse(field + ".use_regex", pre.value("use_regex", true),
             use_regex ? "GPT-2's ByteLevel splits by its own regex" : "after a Split, ByteLevel must not split again");
    }
  }

  void read_byte_level_pre_tokenizer(const json& pre) {
    if (pre.is_null()) refuse("pre_tokenizer", pre, "byte-level BPE needs ByteLevel, or Split + ByteLevel");
    if (type_of(pre) == "ByteLevel") {
      read_byte_level(pre, "pre_tokenizer", true);
      options_.pre_tokenizer = PreTokenizer::kGpt2;
      return;
    }
    if (type_of(pre) != "Sequence" || !pre.contains("pretokenizers") || !pre["pretokenizers"].is_array() ||
        pre["pretokenizers"].size() != 2) {
      refuse("pre_tokenizer", pre, "expected ByteLevel, or a Sequence of Split and ByteLevel");
    }
    const json& split = pre["pretokenizers"][0];
    if (type_of(split) != "Split") refuse("pre_tokenizer.pretokenizers[0]", split, "expected Split");
    const json& pattern = split.value("pattern", json());
    const std::string regex = pattern.is_object() ? str(pattern, "Regex") : std::string();
    if (regex == kLlama3Pattern) {
      options_.pre_tokenizer = PreTokenizer::kLlama3;
    } else if (regex == kQwen2Pattern) {
      options_.pre_tokenizer = PreTokenizer::kQwen2;
    } else {
      refuse("pre_tokenizer.pretokenizers[0].pattern", pattern, "only Llama 3's and Qwen2's split patterns are");
    }
    if (split.value("behavior", std::string()) != "Isolated") {
      refuse("pre_tokenizer.pretokenizers[0].behavior", split.value("behavior", json()), "expected Isolated");
    }
    if (split.value("invert", false)) refuse("pre_tokenizer.pretokenizers[0].invert", true, "expected false");
    read_byte_level(pre["pretokenizers"][1], "pre_tokenizer.pretokenizers[1]", false);
  }

  void read_metaspace(const json& pre, const std::string& field) {
    if (str(pre, "replacement") != kMetaspace) refuse(field + ".replacement", pre.value("replacement", json()), "expected \"▁\"");
    if (pre.value("split", true)) refuse(field + ".split", true, "a section is one word in Llama 2 and Mistral");
    const std::string scheme = pre.value("prepend_scheme", std::string("always"));
    if (scheme == "first") {
      options_.prepend_space = PrependSpace::kFirst;
    } else if (scheme == "always") {
      options_.prepend_space = PrependSpace::kAlways;
    } else if (scheme == "never") {
      options_.prepend_space = PrependSpace::kNever;
    } else {
      refuse(field + ".prepend_scheme", scheme, "expected first, always or never");
    }
  }

  // Llama 2's legacy normalizer: [Prepend("▁"),] Replace(" ", "▁").
  void read_sentencepiece_normalizer(const json& normalizer) {
    if (!j_.value("pre_tokenizer", json()).is_null()) {
      refuse("normalizer", normalizer, "a SentencePiece normalizer with a pre-tokenizer");
    }
    const json& steps = normalizer.value("normalizers", json());
    if (!steps.is_array()) refuse("normalizer", normalizer, "expected a Sequence");
    size_t i = 0;
    if (i < steps.size() && type_of(steps[i]) == "Prepend") {
      if (str(steps[i], "prepend") != kMetaspace) refuse("normalizer.normalizers[0].prepend", steps[i]["prepend"], "expected \"▁\"");
      options_.prepend_space = PrependSpace::kAlwaysEvenAfterSpace;
      ++i;
    }
    const std::string field = fmt::format("normalizer.normalizers[{}]", i);
    if (i >= steps.size() || type_of(steps[i]) != "Replace") refuse(field, i < steps.size() ? steps[i] : json(), "expected Replace");
    const json& pattern = steps[i].value("pattern", json());
    if (!pattern.is_object() || str(pattern, "String") != " " || str(steps[i], "content") != kMetaspace) {
      refuse(field, steps[i], "expected Replace(\" \", \"▁\")");
    }
    if (++i != steps.size()) refuse(fmt::format("normalizer.normalizers[{}]", i), steps[i], "nothing may follow Replace");
  }

  // Byte-level: ByteLevel. SentencePiece-style: Replace("▁", " "), ByteFallback, Fuse, and
  // Strip(" ", 1, 0) when the encoder prepends a space.
  void read_decoder() {
    const json& decoder = j_.value("decoder", json());
    if (!options_.sentencepiece) {
      if (!decoder.is_null()) read_byte_level_decoder(decoder);
      return;
    }
    const json& steps = decoder.value("decoders", json());
    if (type_of(decoder) != "Sequence" || !steps.is_array()) refuse("decoder", decoder, "expected a Sequence");
    std::vector<std::string> types;
    for (size_t i = 0; i < steps.size(); ++i) {
      const json& step = steps[i];
      const std::string field = fmt::format("decoder.decoders[{}]", i);
      types.push_back(type_of(step));
      if (types.back() == "Replace") {
        const json& pattern = step.value("pattern", json());
        if (!pattern.is_object() || str(pattern, "String") != kMetaspace || str(step, "content") != " ") {
          refuse(field, step, "expected Replace(\"▁\", \" \")");
        }
      } else if (types.back() == "Strip") {
        if (str(step, "content") != " " || step.value("start", 0) != 1 || step.value("stop", 0) != 0) {
          refuse(field, step, "expected Strip(\" \", 1, 0)");
        }
        options_.strip_leading_space = true;
      } else if (types.back() == "Metaspace") {
        options_.strip_leading_space = step.value("prepend_scheme", std::string("always")) != "never";
        types.back() = "Replace";
      } else if (types.back() != "ByteFallback" && types.back() != "Fuse") {
        refuse(field, step, "expected Replace, ByteFallback, Fuse, Strip");
      }
    }
    if (types.empty() || types[0] != "Replace") refuse("decoder", decoder, "expected Replace(\"▁\", \" \") first");
  }

  void read_byte_level_decoder(const json& decoder) {
    if (type_of(decoder) != "ByteLevel") refuse("decoder", decoder, "byte-level BPE decodes with ByteLevel");
  }

  // Added tokens: matched verbatim before pre-tokenisation, with the library's options.
  void read_added_tokens() {
    const json& list = j_.value("added_tokens", json::array());
    if (!list.is_array()) refuse("added_tokens", list, "expected an array");
    for (size_t i = 0; i < list.size(); ++i) {
      const json& added = list[i];
      const std::string field = fmt::format("added_tokens[{}]", i);
      check(added.is_object(), "{}: {} must be an object", where_, field);
      const std::string content = str(added, "content");
      check(!content.empty(), "{}: {}.content must be a non-empty string", where_, field);
      check(added.contains("id") && added["id"].is_number_integer(), "{}: added token \"{}\" has no integer id", where_,
            content);
      if (added.value("single_word", false)) {
        refuse(field + ".single_word", true, fmt::format("added token \"{}\": word-boundary matching", content));
      }
      AddedToken token{.id = -1,
                       .special = added.value("special", false),
                       .normalized = added.value("normalized", !added.value("special", false)),
                       .lstrip = added.value("lstrip", false),
                       .rstrip = added.value("rstrip", false)};
      // A normalized token would have to be matched in SentencePiece's rewritten text.
      if (token.normalized && options_.sentencepiece) {
        refuse(field + ".normalized", true, fmt::format("added token \"{}\" in a SentencePiece-style model", content));
      }
      added_.push_back(token);
      added_texts_.push_back(content);
      added_ids_.push_back(added["id"].get<int64_t>());
    }
  }

  // An added token is in model.vocab with the same id (GPT-2's <|endoftext|>), or, added later,
  // takes the next id after it.
  void place_added_tokens(Vocab& v) {
    std::vector<size_t> order(added_.size());
    for (size_t i = 0; i < order.size(); ++i) order[i] = i;
    std::sort(order.begin(), order.end(), [&](size_t a, size_t b) { return added_ids_[a] < added_ids_[b]; });
    for (size_t i : order) {
      const std::string& content = added_texts_[i];
      const int64_t id = added_ids_[i];
      added_[i].id = static_cast<TokenId>(id);
      if (auto found = v.by_string.find(content); found != v.by_string.end()) {
        check(found->second == id, "{}: added token \"{}\" has id {}, model.vocab gives it {}", where_, content, id,
              found->second);
        continue;
      }
      check(id == static_cast<int64_t>(v.tokens.size()),
            "{}: added token \"{}\" has id {}; one not in model.vocab must take the next id, {}", where_, content, id,
            v.tokens.size());
      v.tokens.push_back(content);
      v.by_string.emplace(content, static_cast<TokenId>(id));
    }
  }

  // ByteLevel (offsets only), TemplateProcessing's single-text template (BOS), or a Sequence.
  void read_post_processor(const Vocab& v) {
    const json& post = j_.value("post_processor", json());
    if (post.is_null()) return;
    if (type_of(post) == "Sequence") {
      const json& steps = post.value("processors", json());
      if (!steps.is_array()) refuse("post_processor", post, "expected a Sequence of processors");
      for (size_t i = 0; i < steps.size(); ++i) read_processor(steps[i], fmt::format("post_processor.processors[{}]", i), v);
      return;
    }
    read_processor(post, "post_processor", v);
  }

  void read_processor(const json& p, const std::string& field, const Vocab& v) {
    const std::string type = type_of(p);
    if (type == "ByteLevel") return;  // trims offsets; ids unchanged
    if (type != "TemplateProcessing") refuse(field, p, "expected ByteLevel or TemplateProcessing");
    const json& single = p.value("single", json());
    if (!single.is_array()) refuse(field + ".single", single, "expected a list");
    bool seen_sequence = false;
    for (size_t i = 0; i < single.size(); ++i) {
      const json& item = single[i];
      const std::string at = fmt::format("{}.single[{}]", field, i);
      if (item.contains("Sequence")) {
        if (seen_sequence || str(item["Sequence"], "id") != "A") refuse(at, item, "expected one Sequence A");
        seen_sequence = true;
        continue;
      }
      if (!item.contains("SpecialToken")) refuse(at, item, "expected SpecialToken or Sequence");
      const std::string name = str(item["SpecialToken"], "id");
      const json& ids = p.value("special_tokens", json()).value(name, json()).value("ids", json());
      if (!ids.is_array()) refuse(field + ".special_tokens", p.value("special_tokens", json()), "no ids for " + name);
      for (const json& id : ids) {
        check(id.is_number_integer() && id.get<int64_t>() >= 0 && id.get<int64_t>() < static_cast<int64_t>(v.tokens.size()),
              "{}: {}.special_tokens[\"{}\"]: id {} is not in the vocabulary", where_, field, name, id.dump());
        (seen_sequence ? options_.template_suffix : options_.template_prefix).push_back(id.get<TokenId>());
      }
    }
    if (!seen_sequence) refuse(field + ".single", single, "no Sequence A");
  }

  // transformers' LlamaTokenizerFast rebuilds the template from tokenizer_config.json:
  // [bos_token if add_bos_token (default true)] $A [eos_token if add_eos_token (default false)].
  void read_llama_config(const Vocab& v) {
    if (config_path_.empty() || !fs::exists(config_path_)) return;
    const std::string where = config_path_.string();
    const json config = parse_json_file(config_path_);
    if (!config.is_object()) return;
    static const char* const kLlamaClasses[] = {"LlamaTokenizer", "LlamaTokenizerFast", "CodeLlamaTokenizer",
                                                "CodeLlamaTokenizerFast"};
    const std::string cls = str(config, "tokenizer_class");
    if (std::none_of(std::begin(kLlamaClasses), std::end(kLlamaClasses), [&](const char* c) { return cls == c; })) return;
    // A token setting is its text, or an AddedToken object with "content".
    auto token_id = [&](const char* key, const char* fallback) {
      const json& value = config.value(key, json(fallback));
      const std::string text = value.is_object() ? str(value, "content") : value.is_string() ? value.get<std::string>() : "";
      auto it = v.by_string.find(text);
      check(it != v.by_string.end(), "{}: {} {} is not in the vocabulary of {}", where, key, value.dump(), where_);
      return it->second;
    };
    options_.template_prefix.clear();
    options_.template_suffix.clear();
    if (config.value("add_bos_token", true)) options_.template_prefix.push_back(token_id("bos_token", "<s>"));
    if (config.value("add_eos_token", false)) options_.template_suffix.push_back(token_id("eos_token", "</s>"));
  }

  std::vector<std::pair<TokenId, TokenId>> read_merges(const Vocab& v) const {
    const json& model = j_["model"];
    check(model.contains("merges") && model["merges"].is_array(), "{}: model.merges must be an array", where_);
    std::vector<std::pair<TokenId, TokenId>> merges;
    merges.reserve(model["merges"].size());
    size_t index = 0;
    for (const json& m : model["merges"]) {
      std::string at = fmt::format("{}: model.merges[{}]", where_, index++);
      if (m.is_string()) {
        merges.push_back(parse_merge_line(v, m.get<std::string>(), at));
      } else {
        check(m.is_array() && m.size() == 2 && m[0].is_string() && m[1].is_string(),
              "{}: expected \"LEFT RIGHT\" or [LEFT, RIGHT], got {}", at, m.dump());
        merges.push_back(merge_ids(v, m[0].get<std::string>(), m[1].get<std::string>(), at));
      }
    }
    return merges;
  }

  std::string where_;
  json j_;
  fs::path config_path_;
  TokenizerOptions options_;
  bool byte_fallback_ = false;
  std::string unk_token_;
  std::vector<AddedToken> added_;
  std::vector<std::string> added_texts_;
  std::vector<int64_t> added_ids_;
};

}  // namespace

Tokenizer Tokenizer::load_tokenizer_json(const fs::path& path) { return JsonReader(path, {}).read(); }

Tokenizer Tokenizer::load_tokenizer_json(const fs::path& path, const fs::path& tokenizer_config) {
  return JsonReader(path, tokenizer_config).read();
}

}  // namespace paraflow::data
