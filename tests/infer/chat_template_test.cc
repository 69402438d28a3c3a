// A model directory's chat template (infer/chat_template.h) against transformers' whole path:
// AutoTokenizer.from_pretrained(dir).apply_chat_template(messages, tokenize=False, ...) in
// tests/reference/chat_template_oracle.py (.venv-data; fails when it is missing), for the three
// places a template may be stored; then the end-of-turn markers and the refusals.
#include <gtest/gtest.h>

#include <cstdlib>
#include <filesystem>
#include <nlohmann/json.hpp>

#include "base/file_io.h"
#include "data/tokenizer.h"
#include "expect_error.h"
#include "infer/chat_template.h"
#include "reference_runner.h"

namespace paraflow::infer {
namespace {

namespace fs = std::filesystem;
using nlohmann::ordered_json;
using testing::expect_error;
using testing::source_dir;

std::string template_text(const std::string& file) { return read_file(source_dir() / "tests/infer/chat_templates" / file); }

// A model dir's tokenizer files (a byte-level vocabulary: transformers must load them), with
// `config` merged into the tokenizer_config.json they come with.
fs::path model_dir(const fs::path& root, const std::string& name, const ordered_json& config) {
  const fs::path dir = root / name;
  std::vector<std::string> tokens;
  for (int b = 0; b < 256; ++b) tokens.emplace_back(1, static_cast<char>(b));
  tokens.emplace_back("<|endoftext|>");
  data::Tokenizer(tokens, {}, {256}).save(dir);
  ordered_json merged = ordered_json::parse(read_file(dir / "tokenizer_config.json"));
  merged.update(config);
  write_file_atomic(dir / "tokenizer_config.json", merged.dump(2));
  return dir;
}

// The conversations of tests/infer/chat_template_cases.json that every template here renders.
ordered_json conversations() {
  const ordered_json all = ordered_json::parse(read_file(source_dir() / "tests/infer/chat_template_cases.json"));
  ordered_json chosen = {{"conversations", ordered_json::array()}};
  for (const ordered_json& conversation : all["conversations"]) {
    const std::string name = conversation["name"];
    if (name == "one user turn" || name == "system and user" || name == "multi-turn" || name == "unicode" ||
        name == "empty contents" || name == "template syntax and escapes in content") {
      chosen["conversations"].push_back(conversation);
    }
  }
  return chosen;
}

void expect_renders_as_transformers(const fs::path& dir) {
  const fs::path cases = dir / "cases.json", out = dir / "oracle.json";
  write_file_atomic(cases, conversations().dump());
  const fs::path python = source_dir() / ".venv-data/bin/python";
  ASSERT_TRUE(fs::exists(python)) << python << " not found (run scripts/setup_python_data.sh)";
  const std::string command = python.string() + " " + (source_dir() / "tests/reference/chat_template_oracle.py").string() +
                              " --model-dir " + dir.string() + " --cases " + cases.string() + " --out " + out.string();
  ASSERT_EQ(std::system(command.c_str()), 0) << command;
  const ordered_json expected = ordered_json::parse(read_file(out));
  ASSERT_EQ(expected.size(), 2 * conversations()["conversations"].size());
  const std::optional<ChatTemplate> chat = ChatTemplate::load(dir);
  ASSERT_TRUE(chat.has_value());
  size_t i = 0;
  for (const ordered_json& conversation : conversations()["conversations"]) {
    for (bool add_generation_prompt : {false, true}) {
      const ordered_json& result = expected[i++];
      ASSERT_EQ(result["conversation"], conversation["name"]);
      EXPECT_EQ(chat->render(conversation["messages"], add_generation_prompt), result["rendered"].get<std::string>())
          << dir.filename() << " / " << conversation["name"] << (add_generation_prompt ? " / generation prompt" : "");
    }
  }
}

TEST(ChatTemplate, ATemplateStringInTokenizerConfig) {
  testing::TempDir root;
  // Llama 3.1's, with the eos token as the AddedToken object older configs hold.
  const fs::path dir = model_dir(root.path(), "llama", {{"chat_template", template_text("llama3.1.jinja")},
                                                        {"bos_token", "<|begin_of_text|>"},
                                                        {"eos_token", {{"__type", "AddedToken"}, {"content", "<|eot_id|>"},
                                                                       {"lstrip", false}, {"normalized", false},
                                                                       {"rstrip", false}, {"single_word", false}}}});
  expect_renders_as_transformers(dir);
  EXPECT_EQ(ChatTemplate::load(dir)->end_of_turn(), (std::vector<std::string>{"<|eot_id|>", "<|eom_id|>"}));
}

TEST(ChatTemplate, NamedTemplatesUseTheDefault) {
  testing::TempDir root;
  const fs::path dir = model_dir(root.path(), "qwen",
                                 {{"chat_template", {{{"name", "tool_use"}, {"template", "{{ 'tools only' }}"}},
                                                     {{"name", "default"}, {"template", template_text("qwen2.5.jinja")}}}},
                                  {"bos_token", nullptr},
                                  {"eos_token", "<|im_end|>"}});
  expect_renders_as_transformers(dir);
  EXPECT_EQ(ChatTemplate::load(dir)->end_of_turn(), std::vector<std::string>{"<|im_end|>"});
}

TEST(ChatTemplate, ChatTemplateJinjaWinsOverTheConfig) {
  testing::TempDir root;
  const fs::path dir = model_dir(root.path(), "zephyr",
                                 {{"chat_template", "{{ 'not this one' }}"}, {"bos_token", "<s>"}, {"eos_token", "</s>"}});
  write_file_atomic(dir / "chat_template.jinja", template_text("zephyr.jinja"));
  expect_renders_as_transformers(dir);
  EXPECT_EQ(ChatTemplate::load(dir)->end_of_turn(), std::vector<std::string>{"</s>"});
}

TEST(ChatTemplate, NoTemplateAndBadOnesAreTold) {
  testing::TempDir root;
  EXPECT_FALSE(ChatTemplate::load(model_dir(root.path(), "plain", ordered_json::object())).has_value());
  EXPECT_FALSE(ChatTemplate::load(root.path() / "no-tokenizer-files").has_value());

  const fs::path number = model_dir(root.path(), "number", {{"chat_template", 3}});
  expect_error<InputError>([&] { ChatTemplate::load(number); }, {"tokenizer_config.json", "chat_template must be a string"});
  const fs::path no_default = model_dir(root.path(), "no-default", {{"chat_template", {{{"name", "rag"}, {"template", "x"}}}}});
  expect_error<InputError>([&] { ChatTemplate::load(no_default); }, {"none is named \"default\""});
  const fs::path bad_eos = model_dir(root.path(), "bad-eos", {{"chat_template", "x"}, {"eos_token", 7}});
  expect_error<InputError>([&] { ChatTemplate::load(bad_eos); }, {"tokenizer_config.json: eos_token"});

  // An empty eos token is no end of turn (an empty stop string would end every reply at once).
  const fs::path empty_eos = model_dir(root.path(), "empty-eos", {{"chat_template", "{{ messages[0].content }}"}, {"eos_token", ""}});
  EXPECT_TRUE(ChatTemplate::load(empty_eos)->end_of_turn().empty());

  const fs::path macro = model_dir(root.path(), "macro", ordered_json::object());
  write_file_atomic(macro / "chat_template.jinja", "{{ bos_token }}\n{% macro turn(m) %}{{ m }}{% endmacro %}");
  expect_error<jinja::TemplateSyntaxError>([&] { ChatTemplate::load(macro); },
                                           {"chat_template.jinja line 2", "unsupported construct '{% macro %}'"});
}

}  // namespace
}  // namespace paraflow::infer
