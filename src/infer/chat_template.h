// A model directory's chat template, rendered as transformers' apply_chat_template(messages,
// add_generation_prompt=...) does: the template from `chat_template.jinja` (newer transformers
// write it beside tokenizer_config.json) or else tokenizer_config.json's `chat_template` (a string,
// or a list of {"name", "template"} of which "default" is used), with the tokenizer's special
// tokens (bos_token, eos_token, ...) as variables, and `tools` and `documents` None.
#pragma once

#include <filesystem>
#include <optional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "infer/jinja.h"

namespace paraflow::infer {

class ChatTemplate {
 public:
  // nullopt when the directory has no template. Throws InputError naming the file and field for
  // a malformed tokenizer_config.json, and jinja::TemplateSyntaxError naming the line for a
  // template outside the supported subset.
  static std::optional<ChatTemplate> load(const std::filesystem::path& model_dir);

  ChatTemplate(std::string source, std::string name, nlohmann::ordered_json special_tokens);

  // `messages`: [{"role": ..., "content": ...}, ...]. Throws jinja::TemplateRaised (the template's
  // raise_exception) or jinja::RenderError.
  std::string render(const nlohmann::ordered_json& messages, bool add_generation_prompt) const;

  // The texts that end the assistant's turn, where generation stops: the eos token, and the
  // end-of-turn markers the template writes (Llama 3's <|eot_id|> and <|eom_id|>, ChatML's
  // <|im_end|>, ...).
  const std::vector<std::string>& end_of_turn() const { return end_of_turn_; }
  // The template's text (what GGUF's tokenizer.chat_template holds).
  const std::string& source() const { return source_; }

 private:
  std::string source_;
  jinja::Template template_;
  nlohmann::ordered_json special_tokens_;  // bos_token, eos_token, ... as the template sees them
  std::vector<std::string> end_of_turn_;
};

}  // namespace paraflow::infer
