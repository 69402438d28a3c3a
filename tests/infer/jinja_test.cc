// The Jinja subset against jinja2 as transformers runs it (tests/reference/chat_template_oracle.py
// in .venv-data; fails when it is missing): the chat templates of Llama 3 / 3.1, Qwen2 / 2.5,
// Mistral and Zephyr (tests/infer/chat_templates, sources in its SOURCES.md) and a template of the
// rest of the subset, on every conversation of tests/infer/chat_template_cases.json with and
// without the generation prompt, byte for byte; then the refusals.
#include <gtest/gtest.h>

#include <cstdlib>
#include <filesystem>
#include <nlohmann/json.hpp>

#include "base/file_io.h"
#include "expect_error.h"
#include "infer/jinja.h"
#include "reference_runner.h"

namespace paraflow::infer::jinja {
namespace {

namespace fs = std::filesystem;
using nlohmann::ordered_json;
using testing::expect_error;
using testing::source_dir;

ordered_json run_oracle(const fs::path& out) {
  const fs::path root = source_dir();
  const fs::path python = root / ".venv-data/bin/python";
  if (!fs::exists(python)) {
    ADD_FAILURE() << python << " not found (run scripts/setup_python_data.sh)";
    return {};
  }
  const std::string command = python.string() + " " + (root / "tests/reference/chat_template_oracle.py").string() +
                              " --templates " + (root / "tests/infer/chat_templates").string() + " --cases " +
                              (root / "tests/infer/chat_template_cases.json").string() + " --out " + out.string();
  if (std::system(command.c_str()) != 0) {
    ADD_FAILURE() << "oracle failed: " << command;
    return {};
  }
  return ordered_json::parse(read_file(out));
}

TEST(Jinja, RendersChatTemplatesAsTransformersDoes) {
  testing::TempDir dir;
  const ordered_json results = run_oracle(dir.path() / "oracle.json");
  ASSERT_TRUE(results.is_array() && results.size() >= 150) << "too few oracle results";
  int rendered = 0, raised = 0, failed = 0;
  for (const ordered_json& result : results) {
    const std::string file = result["template"];
    const std::string what = file + " / " + result["conversation"].get<std::string>() +
                             (result["context"]["add_generation_prompt"].get<bool>() ? " / generation prompt" : "");
    const Template chat_template(read_file(source_dir() / "tests/infer/chat_templates" / file), file);
    if (result.contains("rendered")) {
      ++rendered;
      try {
        EXPECT_EQ(chat_template.render(result["context"]), result["rendered"].get<std::string>()) << what;
      } catch (const std::exception& error) {
        ADD_FAILURE() << what << ": " << error.what();
      }
    } else if (result.contains("raised")) {
      ++raised;
      expect_error<TemplateRaised>([&] { chat_template.render(result["context"]); }, {result["raised"].get<std::string>()});
    } else {
      ++failed;  // jinja2 failed (a TypeError: str + None): so must we, with a message naming the line
      expect_error<RenderError>([&] { chat_template.render(result["context"]); }, {file + " line "});
    }
  }
  // The cases cover all three outcomes.
  EXPECT_GT(rendered, 100);
  EXPECT_GT(raised, 5);
  EXPECT_GT(failed, 5);
}

TEST(Jinja, WhitespaceControlMatchesJinja2Settings) {
  // trim_blocks, lstrip_blocks, `-` and `+`, and the one trailing newline jinja2 drops, by hand.
  const auto render = [](const char* source) { return Template(source, "t").render(ordered_json::object()); };
  EXPECT_EQ(render("  {% if true %}\n  a\n  {% endif %}\n  b {# c #}\n{{ 1 }}\n"), "  a\n  b 1");
  EXPECT_EQ(render("x  {%- if true -%}  y  {%- endif %}\n\nz"), "xy\nz");
  EXPECT_EQ(render("  {%+ if true %}a{% endif +%}\nb"), "  a\nb");
  EXPECT_EQ(render("a\r\nb\r\n\n"), "a\nb\n");
}

TEST(Jinja, RefusesUnsupportedConstructsNamingTheLine) {
  const auto refused = [](const char* source, std::vector<std::string> says) {
    expect_error<TemplateSyntaxError>([&] { Template(source, "chat_template"); }, std::move(says));
  };
  refused("{% macro greet(name) %}hi{% endmacro %}", {"chat_template line 1", "unsupported construct '{% macro %}'"});
  refused("a\nb\n{% include 'x.jinja' %}", {"line 3", "'{% include %}'"});
  refused("{% raw %}{{ x }}{% endraw %}", {"line 1", "'{% raw %}'"});
  refused("\n{{ messages | wordcount }}", {"line 2", "the filter 'wordcount'"});
  refused("{% if x is sameish 1 %}{% endif %}", {"line 1", "the test 'sameish'"});
  refused("\n\n{{ 'a'.zfill(3) }}", {"line 3", "the method '.zfill()'"});
  refused("{{ lipsum(2) }}", {"line 1", "calling 'lipsum'"});
  refused("{% set x %}block{% endset %}", {"line 1", "a block set"});
  refused("{% set a, b = 1, 2 %}", {"line 1", "several targets"});
  refused("{% for m in messages recursive %}{% endfor %}", {"a recursive for loop"});
  refused("{% if true %}\nunclosed", {"line 1", "'{% if %}' is never closed with '{% endif %}'"});
  refused("{% for m in messages %}{% if true %}{% endfor %}", {"line 1", "'{% if %}' is never closed"});
  refused("{% for x in y %}{% endif %}", {"line 1"});
  refused("{% endfor %}", {"line 1", "without its opening tag"});
  refused("{{ 'unterminated }}", {"line 1", "never closed"});
  refused("\n{{ (1, 2) }}", {"line 2", "a tuple literal"});
  refused("{{ 1 +* 2 }}", {"line 1", "unexpected '*'"});
  refused("\n\n{{ 123456789012345678901234567890 }}", {"line 3", "the number 123456789012345678901234567890 is out of range"});
  refused("{{ '\\U00110000' }}", {"line 1", "beyond U+10FFFF"});
  // Nesting that would overflow the parser's (and the renderer's) stack.
  refused(("{{ " + std::string(5000, '(') + "1" + std::string(5000, ')') + " }}").c_str(), {"line 1", "nested deeper than 100 levels"});
  refused(("{{ " + std::string(5000, '-') + "1 }}").c_str(), {"nested deeper than 100 levels"});
  std::string blocks;
  for (int i = 0; i < 500; ++i) blocks += "{% if true %}\n";
  refused(blocks.c_str(), {"chat_template line 98: nested deeper than 100 levels"});
  std::string generations;
  for (int i = 0; i < 5000; ++i) generations += "{% generation %}";
  refused(generations.c_str(), {"chat_template line 1", "nested deeper than 100 levels"});
}

TEST(Jinja, RaiseExceptionCarriesTheTemplatesMessage) {
  const Template chat_template("{% if messages | length == 0 %}{{ raise_exception('no messages given') }}{% endif %}",
                               "chat_template");
  expect_error<TemplateRaised>([&] { chat_template.render({{"messages", ordered_json::array()}}); }, {"no messages given"});
}

TEST(Jinja, RangesAndRepetitionsAreBounded) {
  const auto render = [](const char* source) { return Template(source, "t").render(ordered_json::object()); };
  EXPECT_EQ(render("{{ range(100000) | length }} {{ range(5, 0, -2) | list }}"), "100000 [5, 3, 1]");
  expect_error<RenderError>([&] { render("{{ range(100001) | length }}"); }, {"t line 1", "at most 100000"});
  expect_error<RenderError>([&] { render("{{ 'ab' * 100000000 }}"); }, {"t line 1", "more than 64 Mi"});
}

TEST(Jinja, RenderErrorsNameTheLine) {
  const Template chat_template("ok\n{{ messages[0].content + 1 }}", "chat_template");
  const ordered_json context = {{"messages", {{{"content", "x"}}}}};
  expect_error<RenderError>([&] { chat_template.render(context); }, {"chat_template line 2", "'str' and 'int'"});
  const Template undefined("{{ missing.attribute }}", "chat_template");
  expect_error<RenderError>([&] { undefined.render(ordered_json::object()); }, {"line 1", "undefined"});
}

}  // namespace
}  // namespace paraflow::infer::jinja
