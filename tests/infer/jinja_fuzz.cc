// libFuzzer target for the Jinja subset: any template text must parse or be refused with
// TemplateSyntaxError, and what parses must render a short conversation or fail with RenderError
// or TemplateRaised; nothing else may escape, crash or read out of bounds. The seeds are the chat
// templates of tests/infer/chat_templates.
//   scripts/fuzz.sh jinja 60      # 60 seconds
#include <cstddef>
#include <cstdint>
#include <nlohmann/json.hpp>
#include <string_view>

#include "infer/jinja.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace paraflow::infer::jinja;
  static const nlohmann::ordered_json context = nlohmann::ordered_json::parse(R"({
    "messages": [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi \u00e9 "},
                 {"role": "assistant", "content": "Hello", "tool_calls": [{"function": {"name": "f", "arguments": {"a": 1.5}}}]},
                 {"role": "user", "content": ""}],
    "tools": null, "documents": null, "add_generation_prompt": true, "bos_token": "<s>", "eos_token": "</s>"})");
  try {
    const Template parsed(std::string_view(reinterpret_cast<const char*>(data), size), "fuzz");
    parsed.render(context);
  } catch (const TemplateSyntaxError&) {
  } catch (const RenderError&) {
  } catch (const TemplateRaised&) {
  }
  return 0;
}
