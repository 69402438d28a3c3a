// `paraflow serve` as a real process on 127.0.0.1 (a port the system picks), with real clients:
// curl, the official openai Python client, prometheus_client's text parser, the web page in
// headless Chromium through selenium (tests/serve/*.py, in .venv-serve from
// scripts/setup_python_serve.sh: these tests FAIL without it), and raw sockets for the clients
// that misbehave. The model is a tiny GPT trained here on a repeated sentence, so that its greedy
// continuation is readable text.
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/resource.h>

#include <fmt/format.h>

#include <atomic>
#include <fstream>
#include <future>
#include <map>
#include <mutex>
#include <nlohmann/json.hpp>
#include <regex>
#include <thread>

#include "data/tokenizer_train.h"
#include "faults/process.h"
#include "model_configs.h"
#include "reference_runner.h"
#include "serve/http_client.h"
#include "train/trainer.h"
#include "trained_model.h"

namespace paraflow {
namespace {

using nlohmann::json;
using namespace std::chrono_literals;
namespace fs = std::filesystem;

constexpr const char* api_key = "test-key";
constexpr int64_t context = 96;

fs::path source_dir() {
  const char* dir = std::getenv("PARAFLOW_SOURCE_DIR");
  return dir ? dir : PARAFLOW_SOURCE_DIR_FALLBACK;
}

// Byte-level (no tokenizer files: id = byte), trained on a sentence with two-byte characters.
void export_tiny_model(const fs::path& dir) {
  const model::GptConfig config = testing::gpt_config(256, context, 48, 2, 2);
  const std::string sentence = "the quick brown fox jumps over the lazy dog at the caf\xC3\xA9 ";
  std::vector<int32_t> tokens;
  while (tokens.size() < 20000) {
    for (unsigned char byte : sentence) tokens.push_back(byte);
  }
  train::TokenSource data = train::TokenSource::from_tokens(std::move(tokens), 0.1);
  train::Trainer trainer(config, testing::short_training(dir / "run", 150), data, cpu_backend());
  trainer.initialize_or_resume();
  for (int i = 0; i < 150; ++i) trainer.step();
  trainer.export_model(dir / "tiny-gpt");
}

// A running server; its address is read from the line it prints once ready.
class Server {
 public:
  // `models`: the flags that say what to serve; by default `--model <dir>/tiny-gpt`.
  Server(const fs::path& dir, const std::string& flags, const std::string& models = "")
      : output_(dir / fmt::format("serve-{}.log", ++count_)) {
    process_ = std::make_unique<testing::Process>(
        fmt::format("{} serve {} {} --threads 1 --kv-cache-gb 0.002 {}", std::getenv("PARAFLOW_BINARY"),
                    models.empty() ? "--model " + (dir / "tiny-gpt").string() : models,
                    flags.find("--port ") == std::string::npos ? "--port 0" : "", flags),
        output_);
    const std::regex ready("ready on https?://127\\.0\\.0\\.1:([0-9]+)");
    for (auto until = std::chrono::steady_clock::now() + 60s; std::chrono::steady_clock::now() < until;) {
      std::smatch match;
      const std::string text = log();
      if (std::regex_search(text, match, ready)) {
        port_ = std::stoi(match[1]);
        return;
      }
      if (process_->finished()) break;
      std::this_thread::sleep_for(50ms);
    }
    ADD_FAILURE() << "the server did not become ready:\n" << log();
  }
  ~Server() {
    if (!process_->finished()) process_->signal(SIGKILL);
    process_->wait(10s);
  }
  int port() const { return port_; }
  // The gRPC port, from the line a server started with --grpc-port prints.
  int grpc_port() const {
    std::smatch match;
    const std::string text = log();
    return std::regex_search(text, match, std::regex("grpc listening on 127\\.0\\.0\\.1:([0-9]+)")) ? std::stoi(match[1]) : 0;
  }
  std::string url() const { return fmt::format("http://127.0.0.1:{}", port_); }
  testing::Process& process() { return *process_; }
  std::string log() const { return fs::exists(output_) ? read_file(output_) : ""; }

 private:
  static inline int count_ = 0;
  fs::path output_;
  std::unique_ptr<testing::Process> process_;
  int port_ = 0;
};

std::string run(const std::string& command) {
  std::string output;
  FILE* pipe = popen((command + " 2>&1").c_str(), "r");
  char buffer[4096];
  while (size_t got = fread(buffer, 1, sizeof buffer, pipe)) output.append(buffer, got);
  EXPECT_EQ(pclose(pipe), 0) << command << "\n" << output;
  return output;
}

// The texts of a server-sent event stream's chunks, in order; fails unless it ends in [DONE].
std::vector<json> events(const std::string& stream) {
  std::vector<json> chunks;
  size_t at = 0;
  bool done = false;
  while ((at = stream.find("data: ", at)) != std::string::npos) {
    const size_t end = stream.find("\n\n", at);
    const std::string data = stream.substr(at + 6, end - at - 6);
    at = end;
    if (data == "[DONE]") {
      done = true;
    } else {
      chunks.push_back(json::parse(data));  // throws (fails) if a chunk is not valid JSON
    }
  }
  EXPECT_TRUE(done) << stream;
  return chunks;
}

// A series' value, its labels (an engine's model and version) whatever they are; -1 when absent.
double metric(const std::string& metrics, const std::string& name) {
  std::smatch match;
  if (!std::regex_search(metrics, match, std::regex("\n" + name + "(\\{[^}]*\\})? ([0-9.e+-]+)\n"))) return -1;
  return std::stod(match[2]);
}

// A process's resident memory (VmRSS in /proc/<pid>/status), in KiB.
int64_t resident_kib(pid_t pid) {
  std::ifstream status(fmt::format("/proc/{}/status", pid));
  std::string line;
  while (std::getline(status, line)) {
    if (line.rfind("VmRSS:", 0) == 0) return std::stoll(line.substr(6));
  }
  ADD_FAILURE() << "no VmRSS in /proc/" << pid << "/status";
  return -1;
}

class ServeTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    dir_ = new testing::TempDir;
    export_tiny_model(dir_->path());
    server_ = new Server(dir_->path(), fmt::format("--api-key {} --read-timeout 2 --max-num-seqs 4 --max-waiting 4 --grpc-port 0", api_key));
  }
  static void TearDownTestSuite() {
    delete server_;
    delete dir_;
  }
  static testing::HttpReply post(const std::string& path, const json& body) {
    return testing::http_request(server_->port(), "POST", path, body.dump(), api_key);
  }
  static json completion(const json& body) {
    testing::HttpReply reply = post("/v1/completions", body);
    EXPECT_EQ(reply.status, 200) << reply.body;
    return json::parse(reply.body);
  }
  static std::string metrics() { return testing::http_request(server_->port(), "GET", "/metrics", "", api_key).body; }
  // Waits until the engine has nothing running or waiting and every KV block is back in the pool.
  static void expect_engine_idle() {
    std::string text;
    for (auto until = std::chrono::steady_clock::now() + 20s; std::chrono::steady_clock::now() < until;) {
      text = metrics();
      if (metric(text, "paraflow_requests_running") == 0 && metric(text, "paraflow_requests_waiting") == 0 &&
          metric(text, "paraflow_kv_blocks_free") == metric(text, "paraflow_kv_blocks_total")) {
        return;
      }
      std::this_thread::sleep_for(50ms);
    }
    ADD_FAILURE() << "the engine did not return to idle with every KV block free:\n" << text;
  }
  static std::string python() {
    const char* env = std::getenv("PARAFLOW_SERVE_PYTHON");
    const fs::path interpreter = env ? fs::path(env) : source_dir() / ".venv-serve/bin/python";
    EXPECT_TRUE(fs::exists(interpreter)) << "no " << interpreter << ": run scripts/setup_python_serve.sh";
    return interpreter.string();
  }

  static inline testing::TempDir* dir_ = nullptr;
  static inline Server* server_ = nullptr;
};

TEST_F(ServeTest, HealthModelsAndTheApiKey) {
  EXPECT_EQ(testing::http_request(server_->port(), "GET", "/health").status, 200);  // no key needed
  for (const std::string key : {"", "wrong-key"}) {
    testing::HttpReply refused = testing::http_request(server_->port(), "GET", "/v1/models", "", key);
    EXPECT_EQ(refused.status, 401) << key;
    EXPECT_EQ(json::parse(refused.body)["error"]["code"], "invalid_api_key");
    EXPECT_EQ(testing::http_request(server_->port(), "GET", "/metrics", "", key).status, 401);
  }
  testing::HttpReply models = testing::http_request(server_->port(), "GET", "/v1/models", "", api_key);
  ASSERT_EQ(models.status, 200);
  EXPECT_EQ(json::parse(models.body)["data"][0]["id"], "tiny-gpt");
  // HEAD, then GET on the same connection: the HEAD's answer is the GET's header alone (its
  // Content-Length too), so the GET's answer follows it and reads whole.
  testing::Connection both(server_->port());
  ASSERT_TRUE(both.send("HEAD /health HTTP/1.1\r\nHost: x\r\n\r\nGET /health HTTP/1.1\r\nHost: x\r\n"
                        "Connection: close\r\n\r\n"));
  const std::string answers = both.receive_all(5s);
  EXPECT_EQ(answers.rfind("HTTP/1.1 200", 0), 0u) << answers;
  const size_t second = answers.find("\r\n\r\nHTTP/1.1 200");
  ASSERT_NE(second, std::string::npos) << answers;
  const testing::HttpReply got = testing::parse_reply(answers.substr(second + 4));
  EXPECT_EQ(json::parse(got.body)["status"], "ok");
  EXPECT_NE(answers.substr(0, second).find(fmt::format("Content-Length: {}", got.body.size())), std::string::npos)
      << answers;
}

TEST_F(ServeTest, CurlStreamsTheSameTextItGetsWhole) {
  const std::string curl = fmt::format("curl -sS --max-time 60 -H 'Authorization: Bearer {}' -H 'Content-Type: application/json' {}/v1/completions",
                                       api_key, server_->url());
  const json request = {{"prompt", "the quick brown"}, {"max_tokens", 40}, {"temperature", 0}};
  const json whole = json::parse(run(fmt::format("{} -d '{}'", curl, request.dump())));
  EXPECT_EQ(whole["object"], "text_completion");
  EXPECT_EQ(whole["model"], "tiny-gpt");
  EXPECT_EQ(whole["choices"][0]["finish_reason"], "length");
  EXPECT_EQ(whole["usage"]["prompt_tokens"], 15);
  EXPECT_EQ(whole["usage"]["completion_tokens"], 40);
  EXPECT_EQ(whole["usage"]["total_tokens"], 55);
  const std::string text = whole["choices"][0]["text"];
  std::printf("  greedy: \"the quick brown%s\"\n", text.c_str());
  EXPECT_NE(text.find("the"), std::string::npos) << "the model did not learn its sentence";

  json streamed_request = request;
  streamed_request["stream"] = true;
  streamed_request["stream_options"] = {{"include_usage", true}};
  const std::vector<json> chunks = events(run(fmt::format("{} -N -d '{}'", curl, streamed_request.dump())));
  ASSERT_GE(chunks.size(), 3u);
  std::string joined;
  for (size_t i = 0; i + 1 < chunks.size(); ++i) joined += chunks[i]["choices"][0]["text"];
  EXPECT_EQ(joined, text);
  EXPECT_EQ(chunks[chunks.size() - 2]["choices"][0]["finish_reason"], "length");
  EXPECT_EQ(chunks.back()["usage"]["completion_tokens"], 40);
}

TEST_F(ServeTest, StopStringsEndTheTextBeforeThem) {
  const std::string text = completion({{"prompt", "the lazy"}, {"max_tokens", 40}, {"temperature", 0}})["choices"][0]["text"];
  // A stop string from the greedy text itself: three ASCII letters well inside it.
  size_t from = 10;
  while (from + 3 < text.size() && !(std::isalpha(text[from]) && std::isalpha(text[from + 1]) && std::isalpha(text[from + 2]))) {
    ++from;
  }
  ASSERT_LT(from + 3, text.size()) << text;
  const std::string stop = text.substr(from, 3);
  const size_t at = text.find(stop);
  for (bool stream : {false, true}) {
    const json request = {{"prompt", "the lazy"}, {"max_tokens", 40}, {"temperature", 0}, {"stop", {"zzz", stop}},
                          {"stream", stream}};
    testing::HttpReply reply = post("/v1/completions", request);
    ASSERT_EQ(reply.status, 200);
    std::string got, finish_reason;
    if (stream) {
      for (const json& chunk : events(reply.body)) {
        got += chunk["choices"][0]["text"];
        if (!chunk["choices"][0]["finish_reason"].is_null()) finish_reason = chunk["choices"][0]["finish_reason"];
      }
    } else {
      const json whole = json::parse(reply.body);
      got = whole["choices"][0]["text"];
      finish_reason = whole["choices"][0]["finish_reason"];
    }
    EXPECT_EQ(got, text.substr(0, at)) << "stream " << stream;
    EXPECT_EQ(finish_reason, "stop");
  }
}

TEST_F(ServeTest, ChoicesSeedsAndLogprobs) {
  const json request = {{"prompt", "the"}, {"max_tokens", 8}, {"n", 3}, {"seed", 42}, {"logprobs", 2}, {"temperature", 1.5}};
  const json first = completion(request), again = completion(request);
  ASSERT_EQ(first["choices"].size(), 3u);
  EXPECT_EQ(first["choices"], again["choices"]);  // seeded: reproducible
  EXPECT_EQ(first["usage"]["completion_tokens"], 24);
  const json& logprobs = first["choices"][1]["logprobs"];
  ASSERT_EQ(logprobs["tokens"].size(), 8u);
  ASSERT_EQ(logprobs["top_logprobs"].size(), 8u);
  EXPECT_LE(logprobs["top_logprobs"][0].size(), 2u);
  EXPECT_EQ(logprobs["text_offset"][0], 0);
  for (const json& logprob : logprobs["token_logprobs"]) EXPECT_LE(logprob.get<double>(), 0.0);
}

// Greedy through "caf" + "\xC3\xA9": the byte inside the character is named "bytes:\\xc3" (OpenAI's
// form), and every top list holds `logprobs` distinct names, the chosen token's with its own
// value. (Named by their replacement character, the high bytes of this byte-level model shared
// one key, and the least likely of them overwrote the others.)
TEST_F(ServeTest, LogprobsNameEveryTokenApart) {
  const json request = {{"prompt", "the lazy dog at the caf"}, {"max_tokens", 4}, {"logprobs", 5}, {"temperature", 0}};
  const json answer = completion(request);
  const json& logprobs = answer["choices"][0]["logprobs"];
  ASSERT_EQ(logprobs["tokens"].size(), 4u);
  EXPECT_EQ(logprobs["tokens"][0], "bytes:\\xc3") << logprobs.dump();
  for (size_t i = 0; i < 4; ++i) {
    const json& top = logprobs["top_logprobs"][i];
    EXPECT_EQ(top.size(), 5u) << top.dump();
    const std::string token = logprobs["tokens"][i];
    ASSERT_TRUE(top.contains(token)) << token << " " << top.dump();
    EXPECT_EQ(top[token], logprobs["token_logprobs"][i]) << top.dump();
  }
}

// Chat's logprobs (OpenAI's `content` list) are those of the same tokens through /v1/completions
// on the chat template's prompt; each entry names its token, its bytes and its alternatives,
// likeliest first, the greedy token among them at the top; a stream carries the same entries.
TEST_F(ServeTest, ChatLogprobsAreTheCompletionsOnesInChatsShape) {
  const json chat_request = {{"messages", {{{"role", "user"}, {"content", "the quick"}}}},
                             {"max_tokens", 6}, {"temperature", 0}, {"logprobs", true}, {"top_logprobs", 3}};
  testing::HttpReply reply = post("/v1/chat/completions", chat_request);
  ASSERT_EQ(reply.status, 200) << reply.body;
  const json content = json::parse(reply.body)["choices"][0]["logprobs"]["content"];
  const json legacy = completion({{"prompt", "user: the quick\nassistant:"}, {"max_tokens", 6}, {"temperature", 0},
                                  {"logprobs", 3}})["choices"][0]["logprobs"];
  ASSERT_GE(content.size(), 1u) << reply.body;
  ASSERT_LE(content.size(), legacy["tokens"].size());
  for (size_t i = 0; i < content.size(); ++i) {
    const json& entry = content[i];
    EXPECT_EQ(entry["token"], legacy["tokens"][i]) << i;
    EXPECT_EQ(entry["logprob"], legacy["token_logprobs"][i]) << i;
    const std::string token = entry["token"];
    EXPECT_EQ(entry["bytes"], json(std::vector<int>(token.begin(), token.end()))) << i;
    const json& top = entry["top_logprobs"];
    ASSERT_EQ(top.size(), 3u) << top.dump();
    EXPECT_EQ(top[0]["token"], entry["token"]) << top.dump();
    for (size_t k = 0; k < top.size(); ++k) {
      EXPECT_EQ(top[k]["logprob"], legacy["top_logprobs"][i][top[k]["token"].get<std::string>()]) << top.dump();
      if (k > 0) {
        EXPECT_GE(top[k - 1]["logprob"].get<double>(), top[k]["logprob"].get<double>());
      }
    }
  }
  json streamed_request = chat_request;
  streamed_request["stream"] = true;
  json streamed = json::array();
  for (const json& chunk : events(post("/v1/chat/completions", streamed_request).body)) {
    const json& logprobs = chunk["choices"][0]["logprobs"];
    if (!logprobs.is_null()) {
      for (const json& entry : logprobs["content"]) streamed.push_back(entry);
    }
  }
  EXPECT_EQ(streamed, content);
  json plain = chat_request;
  plain.erase("logprobs");
  plain.erase("top_logprobs");
  EXPECT_TRUE(json::parse(post("/v1/chat/completions", plain).body)["choices"][0]["logprobs"].is_null());
}

// echo: the text starts with the prompt's (in a stream, as the first chunk); with logprobs the
// lists start with the prompt's tokens, the first without a log-probability, each other one's
// the same as the log-probability a request for its prefix reports for it (lm-evaluation-harness
// scores continuations this way).
// A model dir with a chat template (tokenizer_config.json's): chat messages are rendered through
// it with its special tokens, the reply ends at its eos token, and its raise_exception is a 400
// that says the template's message. The template is written so that its rendering is known by
// hand ("the " + "lazy"), and the eos token is a word of the model's greedy text after it.
TEST_F(ServeTest, ChatTemplateOfTheModelDir) {
  const std::string text = completion({{"prompt", "the lazy"}, {"max_tokens", 40}, {"temperature", 0}})["choices"][0]["text"];
  size_t from = 10;
  while (from + 3 < text.size() && !(std::isalpha(text[from]) && std::isalpha(text[from + 1]) && std::isalpha(text[from + 2]))) {
    ++from;
  }
  ASSERT_LT(from + 3, text.size()) << text;
  const std::string eos = text.substr(from, 3);
  const fs::path templated = dir_->path() / "templated";
  fs::copy(dir_->path() / "tiny-gpt", templated, fs::copy_options::recursive);
  const json config = {{"chat_template",
                        "{{ bos_token }}\n{%- if messages[0].role == 'system' %}\n"
                        "  {{- raise_exception('no system messages here, got: ' ~ messages[0].content) }}\n"
                        "{%- endif %}\n{%- for m in messages %}{{ m.content }}{% endfor %}"},
                       {"bos_token", "the "},
                       {"eos_token", eos}};
  std::ofstream(templated / "tokenizer_config.json") << config.dump();
  Server server(dir_->path(), "", "--model " + templated.string());
  const auto chat = [&](const json& body) {
    return testing::http_request(server.port(), "POST", "/v1/chat/completions", body.dump());
  };
  for (bool stream : {false, true}) {
    json request = {{"messages", {{{"role", "user"}, {"content", "lazy"}}}}, {"max_tokens", 40}, {"temperature", 0},
                    {"stream", stream}};
    if (stream) request["stream_options"] = {{"include_usage", true}};
    testing::HttpReply reply = chat(request);
    ASSERT_EQ(reply.status, 200) << reply.body;
    std::string content, finish_reason;
    int64_t prompt_tokens = -1;
    for (const json& answer : stream ? events(reply.body) : std::vector<json>{json::parse(reply.body)}) {
      if (answer.contains("usage") && answer["usage"].is_object()) prompt_tokens = answer["usage"]["prompt_tokens"];
      if (answer["choices"].empty()) continue;
      const json& choice = answer["choices"][0];
      content += stream ? choice["delta"].value("content", "") : choice["message"]["content"].get<std::string>();
      if (!choice["finish_reason"].is_null()) finish_reason = choice["finish_reason"];
    }
    EXPECT_EQ(prompt_tokens, 8) << "the prompt is \"the lazy\", one token a byte";
    EXPECT_EQ(content, text.substr(0, text.find(eos))) << "stream " << stream;
    EXPECT_EQ(finish_reason, "stop");
  }
  const testing::HttpReply raised = chat({{"messages", {{{"role", "system"}, {"content", "be brief"}}, {{"role", "user"}, {"content", "x"}}}}});
  EXPECT_EQ(raised.status, 400) << raised.body;
  const json error = json::parse(raised.body)["error"];
  EXPECT_EQ(error["message"], "no system messages here, got: be brief");
  EXPECT_EQ(error["param"], "messages");
}

// A template outside the supported Jinja subset is refused when the model loads, naming its line.
TEST_F(ServeTest, AnUnsupportedChatTemplateIsRefusedAtLoad) {
  const fs::path macro = dir_->path() / "macro-template";
  fs::copy(dir_->path() / "tiny-gpt", macro, fs::copy_options::recursive);
  std::ofstream(macro / "chat_template.jinja") << "{{ bos_token }}\n{% macro turn(m) %}{{ m.content }}{% endmacro %}\n";
  const testing::Ended ended = testing::run_process(
      fmt::format("{} serve --model {} --port 0", std::getenv("PARAFLOW_BINARY"), macro.string()), macro / "serve.log", 60s);
  testing::expect_clean_end(ended, "macro template");
  EXPECT_EQ(ended.exit_code, 1) << ended.output;
  EXPECT_NE(ended.output.find("chat_template.jinja line 2: unsupported construct '{% macro %}'"), std::string::npos)
      << ended.output;
}

TEST_F(ServeTest, EchoReturnsThePromptAndItsLogprobs) {
  const std::string prompt = "the quick";
  const json plain = completion({{"prompt", prompt}, {"max_tokens", 4}, {"temperature", 0}});
  const json echoed = completion({{"prompt", prompt}, {"max_tokens", 4}, {"temperature", 0}, {"echo", true}});
  EXPECT_EQ(echoed["choices"][0]["text"], prompt + plain["choices"][0]["text"].get<std::string>());
  EXPECT_EQ(echoed["usage"], plain["usage"]);

  const json scored = completion({{"prompt", prompt}, {"max_tokens", 1}, {"temperature", 0}, {"echo", true},
                                  {"logprobs", 5}})["choices"][0];
  const json& logprobs = scored["logprobs"];
  ASSERT_EQ(logprobs["tokens"].size(), prompt.size() + 1) << logprobs.dump();
  EXPECT_TRUE(logprobs["token_logprobs"][0].is_null());
  EXPECT_TRUE(logprobs["top_logprobs"][0].is_null());
  int compared = 0;
  for (size_t i = 0; i < prompt.size(); ++i) {
    EXPECT_EQ(logprobs["tokens"][i], prompt.substr(i, 1)) << i;
    EXPECT_EQ(logprobs["text_offset"][i], i) << i;
    if (i == 0) continue;
    const json next = completion({{"prompt", prompt.substr(0, i)}, {"max_tokens", 1}, {"temperature", 0},
                                  {"logprobs", 5}})["choices"][0]["logprobs"]["top_logprobs"][0];
    EXPECT_EQ(logprobs["top_logprobs"][i], next) << i;
    if (next.contains(prompt.substr(i, 1))) {
      EXPECT_EQ(logprobs["token_logprobs"][i], next[prompt.substr(i, 1)]) << i;
      ++compared;
    }
  }
  EXPECT_GE(compared, 4);  // the model, trained on this sentence, mostly expects the prompt's letters
  EXPECT_EQ(logprobs["text_offset"][prompt.size()], prompt.size());

  std::string streamed, first;
  for (const json& chunk : events(post("/v1/completions", {{"prompt", prompt}, {"max_tokens", 4}, {"temperature", 0},
                                                           {"echo", true}, {"stream", true}}).body)) {
    if (chunk["choices"].empty()) continue;
    if (first.empty()) first = chunk["choices"][0]["text"];
    streamed += chunk["choices"][0]["text"];
  }
  EXPECT_EQ(first, prompt);
  EXPECT_EQ(streamed, echoed["choices"][0]["text"]);
}

// A batch of prompts: n choices per prompt, numbered prompt by prompt, each the completion its
// prompt gets alone (echoed with its own prompt), whole and streamed; usage counts each prompt
// once.
TEST_F(ServeTest, ABatchOfPromptsAnswersEachInTurn) {
  const std::vector<std::string> prompts{"the quick", "the lazy dog"};
  std::vector<std::string> alone;
  for (const std::string& prompt : prompts) {
    alone.push_back(completion({{"prompt", prompt}, {"max_tokens", 5}, {"temperature", 0}})["choices"][0]["text"]);
  }
  const json batch = {{"prompt", prompts}, {"max_tokens", 5}, {"temperature", 0}, {"n", 2}, {"echo", true}};
  const json whole = completion(batch);
  ASSERT_EQ(whole["choices"].size(), 4u) << whole.dump();
  EXPECT_EQ(whole["usage"]["prompt_tokens"], prompts[0].size() + prompts[1].size());
  EXPECT_EQ(whole["usage"]["completion_tokens"], 20);
  std::map<int, std::string> streamed;
  json stream_request = batch;
  stream_request["stream"] = true;
  for (const json& chunk : events(post("/v1/completions", stream_request).body)) {
    for (const json& choice : chunk["choices"]) streamed[choice["index"].get<int>()] += choice["text"].get<std::string>();
  }
  for (size_t i = 0; i < 4; ++i) {
    const json& choice = whole["choices"][i];
    EXPECT_EQ(choice["index"], i);
    EXPECT_EQ(choice["text"], prompts[i / 2] + alone[i / 2]) << i;
    EXPECT_EQ(streamed[static_cast<int>(i)], prompts[i / 2] + alone[i / 2]) << i;
  }
  const testing::HttpReply too_long = post("/v1/completions", {{"prompt", {"the", std::string(200, 'x')}}});
  EXPECT_EQ(too_long.status, 400);
  EXPECT_NE(too_long.body.find("prompt[1] is 200 tokens"), std::string::npos) << too_long.body;
  const testing::HttpReply outside = post("/v1/completions", {{"prompt", {{1, 2}, {3, 256}}}});
  EXPECT_EQ(outside.status, 400);
  EXPECT_NE(outside.body.find("prompt[1]: token id 256 is outside the model's vocabulary of 256"), std::string::npos)
      << outside.body;
}

// OpenAI's logit_bias and penalties reach the sampler. A token biased by -100 is never chosen.
// With penalties each greedy choice is the best of the raw log-probabilities (what `logprobs`
// reports, as vLLM does) less 1.5 per earlier choice of that token (frequency) and 2 if there
// was one (presence); and the penalties do change some choices away from the raw argmax.
TEST_F(ServeTest, LogitBiasAndPenaltiesSteerTheChoice) {
  const json greedy = {{"prompt", "the quick"}, {"max_tokens", 16}, {"temperature", 0}};
  const std::string plain = completion(greedy)["choices"][0]["text"];
  ASSERT_FALSE(plain.empty());
  json biased = greedy;
  biased["logit_bias"] = {{std::to_string(static_cast<unsigned char>(plain[0])), -100}};
  const std::string steered = completion(biased)["choices"][0]["text"];
  EXPECT_EQ(steered.find(plain[0]), std::string::npos) << "'" << plain[0] << "' in " << steered;

  // The API's largest penalties, over enough tokens that repeats outweigh a confident model.
  constexpr double kFrequency = 2.0, kPresence = 2.0;
  json penalised = greedy;
  penalised["max_tokens"] = 48;
  penalised["frequency_penalty"] = kFrequency;
  penalised["presence_penalty"] = kPresence;
  penalised["logprobs"] = 5;
  const json logprobs = completion(penalised)["choices"][0]["logprobs"];
  std::map<std::string, int> chosen;
  int moved = 0;
  for (size_t i = 0; i < logprobs["tokens"].size(); ++i) {
    // The logprobs are the model's, before the penalties: the chosen token's may be outside the
    // top 5 once the penalties pushed the likelier ones down.
    const std::string token = logprobs["tokens"][i];
    const double token_logprob = logprobs["token_logprobs"][i];
    const json& top = logprobs["top_logprobs"][i];
    auto adjusted = [&](const std::string& name, double logprob) {
      return logprob - kFrequency * chosen[name] - (chosen[name] > 0 ? kPresence : 0.0);
    };
    std::string raw_best;
    for (const auto& [name, logprob] : top.items()) {
      EXPECT_GE(adjusted(token, token_logprob), adjusted(name, logprob.get<double>()) - 1e-4)
          << i << ": " << token << " chosen over " << name;
      if (raw_best.empty() || logprob.get<double>() > top[raw_best].get<double>()) raw_best = name;
    }
    moved += raw_best != token;
    ++chosen[token];
  }
  EXPECT_GT(moved, 0) << logprobs.dump();
}

// A completion that ends with the end-of-text token lists it last in its logprobs (named as its
// tokenizer names it, adding no text), whole and streamed: lm-evaluation-harness reads the last
// entry as the generated token. (A model with a BPE tokenizer; logit_bias makes it end at once.)
TEST(ServeTokenizer, AnEndOfTextTokenIsListedInTheLogprobs) {
  testing::TempDir dir;
  data::BpeTrainOptions options;
  options.vocab_size = 300;
  data::BpeTrainer bpe(options);
  bpe.add_text("the quick brown fox jumps over the lazy dog ");
  const data::Tokenizer tokenizer = bpe.train();
  const model::GptConfig config = testing::gpt_config(tokenizer.vocab_size(), context, 48, 2, 2);
  train::TokenSource data = train::TokenSource::from_tokens(std::vector<int32_t>(2000, 5), 0.1);
  train::Trainer trainer(config, testing::short_training(dir.path() / "run", 1), data, cpu_backend());
  trainer.initialize_or_resume();
  trainer.export_model(dir.path() / "bpe-gpt");
  tokenizer.save(dir.path() / "bpe-gpt");
  Server server(dir.path(), "", "--model " + (dir.path() / "bpe-gpt").string());
  const int64_t prompt_tokens = static_cast<int64_t>(tokenizer.encode("the quick").size());
  json request = {{"prompt", "the quick"}, {"max_tokens", 3}, {"temperature", 0}, {"logprobs", 1}, {"echo", true},
                  {"logit_bias", {{std::to_string(tokenizer.eot_id()), 100}}}};
  const testing::HttpReply reply = testing::http_request(server.port(), "POST", "/v1/completions", request.dump());
  ASSERT_EQ(reply.status, 200) << reply.body;
  const json choice = json::parse(reply.body)["choices"][0];
  EXPECT_EQ(choice["text"], "the quick");
  EXPECT_EQ(choice["finish_reason"], "stop");
  const json& logprobs = choice["logprobs"];
  ASSERT_EQ(logprobs["tokens"].size(), static_cast<size_t>(prompt_tokens + 1)) << logprobs.dump();
  EXPECT_EQ(logprobs["tokens"].back(), "<|endoftext|>");
  EXPECT_TRUE(logprobs["token_logprobs"].back().is_number());
  EXPECT_EQ(logprobs["text_offset"].back(), 9);
  request["stream"] = true;
  json streamed = json::array();
  for (const json& chunk : events(testing::http_request(server.port(), "POST", "/v1/completions", request.dump()).body)) {
    if (!chunk["choices"].empty() && !chunk["choices"][0]["logprobs"].is_null()) {
      for (const json& token : chunk["choices"][0]["logprobs"]["tokens"]) streamed.push_back(token);
    }
  }
  EXPECT_EQ(streamed, logprobs["tokens"]);
}

// A template whose end-of-turn marker is a special token of the tokenizer (ChatML's <|im_end|>):
// generating it ends the reply, and its text is not part of it. logit_bias makes the model pick
// it first; without the template the same request writes the marker as text.
TEST(ServeTokenizer, AChatTemplatesEndOfTurnTokenEndsTheReply) {
  testing::TempDir dir;
  data::BpeTrainOptions options;
  options.vocab_size = 300;
  options.special_tokens = {"<|endoftext|>", "<|im_start|>", "<|im_end|>"};
  data::BpeTrainer bpe(options);
  bpe.add_text("the quick brown fox jumps over the lazy dog ");
  const data::Tokenizer tokenizer = bpe.train();
  const int32_t im_end = tokenizer.special_id("<|im_end|>");
  ASSERT_GE(im_end, 0);
  const model::GptConfig config = testing::gpt_config(tokenizer.vocab_size(), context, 48, 2, 2);
  train::TokenSource data = train::TokenSource::from_tokens(std::vector<int32_t>(2000, 5), 0.1);
  train::Trainer trainer(config, testing::short_training(dir.path() / "run", 1), data, cpu_backend());
  trainer.initialize_or_resume();
  for (const char* name : {"plain", "chatml"}) {
    trainer.export_model(dir.path() / name);
    tokenizer.save(dir.path() / name);
  }
  json tokenizer_config = json::parse(read_file(dir.path() / "chatml/tokenizer_config.json"));
  tokenizer_config["chat_template"] = read_file(source_dir() / "tests/infer/chat_templates/qwen2.jinja");
  tokenizer_config["eos_token"] = "<|endoftext|>";
  std::ofstream(dir.path() / "chatml/tokenizer_config.json") << tokenizer_config.dump();
  const json request = {{"messages", {{{"role", "user"}, {"content", "the quick"}}}}, {"max_tokens", 4},
                        {"temperature", 0}, {"logit_bias", {{std::to_string(im_end), 100}}}};
  for (const char* name : {"plain", "chatml"}) {
    Server server(dir.path(), "", "--model " + (dir.path() / name).string());
    const testing::HttpReply reply = testing::http_request(server.port(), "POST", "/v1/chat/completions", request.dump());
    ASSERT_EQ(reply.status, 200) << reply.body;
    const json answer = json::parse(reply.body);
    if (std::string(name) == "chatml") {
      EXPECT_EQ(answer["choices"][0]["message"]["content"], "");
      EXPECT_EQ(answer["choices"][0]["finish_reason"], "stop");
      EXPECT_EQ(answer["usage"]["completion_tokens"], 1);
      // The prompt is the template's: ChatML with Qwen2's default system message.
      const std::string prompt = "<|im_start|>system\nYou are a helpful assistant.<|im_end|>\n<|im_start|>user\nthe quick"
                                 "<|im_end|>\n<|im_start|>assistant\n";
      EXPECT_EQ(answer["usage"]["prompt_tokens"], static_cast<int64_t>(tokenizer.encode(prompt).size()));
    } else {
      EXPECT_EQ(answer["choices"][0]["message"]["content"], "<|im_end|><|im_end|><|im_end|><|im_end|>");
      EXPECT_EQ(answer["choices"][0]["finish_reason"], "length");
    }
  }
}

// An HTTP/1.0 client is answered in HTTP/1.0: a stream without chunked encoding (which 1.0 does
// not have), its body ending when the connection closes; a 1.0 keep-alive is confirmed.
TEST_F(ServeTest, Http10ClientsGetHttp10Answers) {
  const std::string body = json{{"prompt", "the quick"}, {"max_tokens", 5}, {"stream", true}}.dump();
  testing::Connection streaming(server_->port());
  ASSERT_TRUE(streaming.send(fmt::format("POST /v1/completions HTTP/1.0\r\nAuthorization: Bearer {}\r\nContent-Type: "
                                         "application/json\r\nContent-Length: {}\r\n\r\n{}",
                                         api_key, body.size(), body)));
  bool closed = false;
  const std::string answer = streaming.receive_all(30s, &closed);
  EXPECT_TRUE(closed);
  EXPECT_EQ(answer.rfind("HTTP/1.0 200", 0), 0u) << answer;
  const std::string header = answer.substr(0, answer.find("\r\n\r\n"));
  EXPECT_EQ(header.find("chunked"), std::string::npos) << header;
  const std::vector<json> chunks = events(answer.substr(header.size() + 4));
  EXPECT_GE(chunks.size(), 2u);

  testing::Connection kept(server_->port());
  ASSERT_TRUE(kept.send("GET /health HTTP/1.0\r\nConnection: keep-alive\r\n\r\n"));
  std::string first;
  while (first.find("\"ok\"") == std::string::npos && kept.receive(first, 5000ms)) {
  }
  EXPECT_EQ(first.rfind("HTTP/1.0 200", 0), 0u) << first;
  EXPECT_NE(first.find("Connection: keep-alive"), std::string::npos) << first;
  ASSERT_TRUE(kept.send("GET /health HTTP/1.0\r\n\r\n"));  // the same connection, a second answer
  bool second_closed = false;
  const std::string second = kept.receive_all(10s, &second_closed);
  EXPECT_EQ(second.rfind("HTTP/1.0 200", 0), 0u) << second;
  EXPECT_TRUE(second_closed);
}

TEST_F(ServeTest, OpenAiPythonClient) {
  run(fmt::format("{} {} --base-url {}/v1 --api-key {}", python(), (source_dir() / "tests/serve/openai_client_check.py").string(),
                  server_->url(), api_key));
}

// Python with TF Serving's client (tensorflow-serving-api in .venv-data, scripts/setup_python_data.sh:
// the tests using it FAIL without it).
fs::path data_python() {
  const char* env = std::getenv("PARAFLOW_DATA_PYTHON");
  const fs::path python = env ? fs::path(env) : source_dir() / ".venv-data/bin/python";
  EXPECT_TRUE(fs::exists(python)) << "no " << python << ": run scripts/setup_python_data.sh";
  return python;
}

// TF Serving's Python client on --grpc-port: Predict, GetModelMetadata, GetModelStatus, the
// signatures the model lacks, and their errors.
TEST_F(ServeTest, TfServingGrpcClient) {
  ASSERT_NE(server_->grpc_port(), 0) << server_->log();
  const fs::path python = data_python();
  std::printf("%s\n", run(fmt::format("{} {} --grpc-port {} --http-port {} --model tiny-gpt --api-key {}", python.string(),
                                      (source_dir() / "tests/serve/tf_serving_grpc_check.py").string(),
                                      server_->grpc_port(), server_->port(), api_key))
                          .c_str());
  expect_engine_idle();
}

// Servers started as TF Serving is (its Docker command line, config files, reloads while clients
// ask, refusals at start), checked with TF Serving's client and HTTP: tf_serving_server_check.py.
TEST_F(ServeTest, TfServingCommandLinesAndConfigReloads) {
  const fs::path work = dir_->path() / "tf-serving";
  fs::create_directories(work);
  std::printf("%s\n", run(fmt::format("{} {} --paraflow {} --model {} --work {}", data_python().string(),
                                      (source_dir() / "tests/serve/tf_serving_server_check.py").string(),
                                      std::getenv("PARAFLOW_BINARY"), (dir_->path() / "tiny-gpt").string(),
                                      work.string()))
                          .c_str());
}

TEST_F(ServeTest, PrometheusParserReadsTheMetrics) {
  completion({{"prompt", "the"}, {"max_tokens", 4}});
  expect_engine_idle();
  std::printf("%s\n", run(fmt::format("{} {} --url {}/metrics --api-key {}", python(),
                                      (source_dir() / "tests/serve/metrics_check.py").string(), server_->url(), api_key))
                          .c_str());
}

// The web page at / in headless Chromium (tests/serve/web_page_check.py: selenium in .venv-serve,
// Debian's chromium and chromium-driver; FAILS without them), with a screenshot in the build dir.
TEST_F(ServeTest, WebPageInABrowser) {
  const fs::path screenshot = fs::path(PARAFLOW_ARTIFACTS_DIR) / "web_page.png";
  fs::create_directories(screenshot.parent_path());
  fs::remove(screenshot);
  std::printf("%s", run(fmt::format("{} {} --url {} --api-key {} --model tiny-gpt --screenshot {}", python(),
                                    (source_dir() / "tests/serve/web_page_check.py").string(), server_->url(), api_key,
                                    screenshot.string()))
                        .c_str());
  ASSERT_TRUE(fs::exists(screenshot));
  EXPECT_GT(fs::file_size(screenshot), 0u);
  expect_engine_idle();
}

// A port free now, for a server whose flags must name its own address before it starts.
int free_port() {
  const int fd = socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in address{.sin_family = AF_INET, .sin_port = 0, .sin_addr = {htonl(INADDR_LOOPBACK)}, .sin_zero = {}};
  socklen_t length = sizeof address;
  EXPECT_EQ(bind(fd, reinterpret_cast<sockaddr*>(&address), sizeof address), 0);
  EXPECT_EQ(getsockname(fd, reinterpret_cast<sockaddr*>(&address), &length), 0);
  close(fd);
  return ntohs(address.sin_port);
}

// The page on a server without an API key (no key field shows), and CORS in the browser: the
// server allows its own address under the name localhost as another origin (--allowed-origins),
// whose page calls the API; a preflight from an origin not listed gets no CORS header.
TEST_F(ServeTest, WebPageWithoutAKeyAndFromAnAllowedOrigin) {
  const int port = free_port();
  const std::string allowed = fmt::format("http://localhost:{}", port);
  Server keyless(dir_->path(), fmt::format("--port {} --allowed-origins {}", port, allowed));
  ASSERT_EQ(keyless.port(), port) << keyless.log();
  for (const std::string& origin : {allowed, std::string("http://localhost:1")}) {
    testing::Connection preflight(port);
    ASSERT_TRUE(preflight.send(fmt::format("OPTIONS /v1/completions HTTP/1.1\r\nHost: x\r\nOrigin: {}\r\n"
                                           "Access-Control-Request-Method: POST\r\nConnection: close\r\n\r\n",
                                           origin)));
    const testing::HttpReply reply = testing::parse_reply(preflight.receive_all(5s));
    SCOPED_TRACE(origin + "\n" + reply.headers);
    EXPECT_EQ(reply.status, origin == allowed ? 200 : 400);
    EXPECT_EQ(reply.headers.find("Access-Control-Allow-Origin: " + allowed) != std::string::npos, origin == allowed);
    EXPECT_EQ(reply.headers.find("Access-Control-") != std::string::npos, origin == allowed);
  }
  const fs::path screenshot = fs::path(PARAFLOW_ARTIFACTS_DIR) / "web_page_without_key.png";
  fs::create_directories(screenshot.parent_path());
  std::printf("%s", run(fmt::format("{} {} --url {} --api-key '' --model tiny-gpt --screenshot {} --cross-origin {}",
                                    python(), (source_dir() / "tests/serve/web_page_check.py").string(), keyless.url(),
                                    screenshot.string(), allowed))
                        .c_str());
}

// A CA, and a server's and a client's certificate it signs (the server's for localhost and
// 127.0.0.1), made with the openssl CLI in `dir`: ca.pem, server.pem/.key, client.pem/.key.
void make_certificates(const fs::path& dir) {
  const std::string openssl = fmt::format("cd {} && openssl", dir.string());
  run(openssl + " req -x509 -newkey rsa:2048 -nodes -keyout ca.key -out ca.pem -days 2 -subj /CN=paraflow-test-ca "
                "-addext basicConstraints=critical,CA:TRUE -addext keyUsage=critical,keyCertSign,cRLSign");
  for (const std::string name : {"server", "client"}) {
    std::ofstream(dir / (name + ".ext"))
        << "basicConstraints=CA:FALSE\nauthorityKeyIdentifier=keyid,issuer\nkeyUsage=digitalSignature,keyEncipherment\n"
        << (name == "server" ? "extendedKeyUsage=serverAuth\nsubjectAltName=DNS:localhost,IP:127.0.0.1\n"
                             : "extendedKeyUsage=clientAuth\n");
    run(fmt::format("{} req -newkey rsa:2048 -nodes -keyout {}.key -out {}.csr -subj /CN={}", openssl, name, name, name));
    run(fmt::format("{} x509 -req -in {}.csr -CA ca.pem -CAkey ca.key -CAcreateserial -days 2 -out {}.pem -extfile {}.ext",
                    openssl, name, name, name));
  }
}

// HTTPS (--ssl-certfile, --ssl-keyfile) with the openai client, and gRPC over TLS with TF
// Serving's --ssl_config_file (client_verify) with TF Serving's gRPC client, each trusting the CA
// the test made (tests/serve/tls_check.py).
TEST_F(ServeTest, TlsForHttpAndGrpc) {
  const fs::path dir = dir_->path() / "tls";
  fs::create_directories(dir);
  make_certificates(dir);
  // SSLConfig's fields hold the PEM texts themselves, as TF Serving reads them.
  const auto pem = [&](const char* file) { return std::regex_replace(read_file(dir / file), std::regex("\n"), "\\n"); };
  std::ofstream(dir / "ssl_config.txt") << fmt::format(
      "server_key: \"{}\"\nserver_cert: \"{}\"\ncustom_ca: \"{}\"\nclient_verify: true\n", pem("server.key"),
      pem("server.pem"), pem("ca.pem"));
  Server tls(dir_->path(), fmt::format("--api-key {} --ssl-certfile {} --ssl-keyfile {} --grpc-port 0 --ssl_config_file {}",
                                       api_key, (dir / "server.pem").string(), (dir / "server.key").string(),
                                       (dir / "ssl_config.txt").string()));
  ASSERT_NE(tls.log().find(fmt::format("ready on https://127.0.0.1:{}", tls.port())), std::string::npos) << tls.log();
  const std::string check = (source_dir() / "tests/serve/tls_check.py").string();
  std::printf("%s", run(fmt::format("{} {} openai --url https://127.0.0.1:{} --ca {} --api-key {} --model tiny-gpt",
                                    python(), check, tls.port(), (dir / "ca.pem").string(), api_key))
                        .c_str());
  const char* env = std::getenv("PARAFLOW_DATA_PYTHON");
  const fs::path data_python = env ? fs::path(env) : source_dir() / ".venv-data/bin/python";
  std::printf("%s", run(fmt::format("{} {} grpc --port {} --ca {} --client-cert {} --client-key {} --api-key {} "
                                    "--model tiny-gpt",
                                    data_python.string(), check, tls.grpc_port(), (dir / "ca.pem").string(),
                                    (dir / "client.pem").string(), (dir / "client.key").string(), api_key))
                        .c_str());
  EXPECT_FALSE(tls.process().finished()) << tls.log();  // failed handshakes did the server no harm
}

// Bad TLS flags stop the server at start, naming the flag.
TEST_F(ServeTest, BadTlsFlagsAreNamed) {
  const fs::path dir = dir_->path() / "bad-tls";
  fs::create_directories(dir);
  std::ofstream(dir / "not.pem") << "not a certificate\n";
  std::ofstream(dir / "ssl_config.txt") << "server_kee: \"x\"\n";
  const std::string model = "--model " + (dir_->path() / "tiny-gpt").string();
  const auto refused = [&](const std::string& flags, const std::string& says) {
    const testing::Ended ended = testing::run_process(
        fmt::format("{} serve {} --port 0 {}", std::getenv("PARAFLOW_BINARY"), model, flags), dir / "serve.log", 60s);
    testing::expect_clean_end(ended, flags);
    EXPECT_EQ(ended.exit_code, 1) << flags << "\n" << ended.output;
    EXPECT_NE(ended.output.find(says), std::string::npos) << flags << "\n" << ended.output;
  };
  const std::string not_pem = (dir / "not.pem").string();
  refused(fmt::format("--ssl-certfile {} --ssl-keyfile {}", not_pem, not_pem), "--ssl-certfile " + not_pem);
  refused("--ssl-certfile " + not_pem, "--ssl-certfile and --ssl-keyfile go together");
  refused(fmt::format("--grpc-port 0 --ssl_config_file {}", (dir / "ssl_config.txt").string()),
          "--ssl_config_file " + (dir / "ssl_config.txt").string() + ":1:");
}

TEST_F(ServeTest, BadRequestsGetClearErrors) {
  struct Case {
    std::string path, body;
    int status;
    json param;
  };
  const std::string too_long(context, 'a');
  const std::vector<Case> cases = {
      {"/v1/completions", R"({"prompt": "x",)", 400, nullptr},
      {"/v1/completions", R"({"prompt": "x", "max_token": 3})", 400, "max_token"},
      {"/v1/completions", R"({"prompt": "x", "max_tokens": 0})", 400, "max_tokens"},
      {"/v1/completions", R"({"prompt": ""})", 400, "prompt"},
      {"/v1/completions", json{{"prompt", too_long}}.dump(), 400, "prompt"},
      {"/v1/completions", R"({"prompt": "abc", "max_tokens": 94})", 400, "max_tokens"},
      {"/v1/completions", "{\"prompt\": \"\xff\xfe\"}", 400, "prompt"},
      {"/v1/completions", R"({"prompt": [1, 300]})", 400, "prompt"},
      {"/v1/completions", R"({"prompt": "x", "model": "gpt-4"})", 404, "model"},
      {"/v1/chat/completions", R"({"messages": [{"role": "user", "content": 1}]})", 400, "messages[0].content"},
      {"/v1/nothing", "{}", 404, nullptr},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(c.body);
    const testing::HttpReply reply = testing::http_request(server_->port(), "POST", c.path, c.body, api_key);
    EXPECT_EQ(reply.status, c.status);
    const json error = json::parse(reply.body)["error"];
    EXPECT_EQ(error["param"], c.param);
    EXPECT_FALSE(error["message"].get<std::string>().empty());
    EXPECT_TRUE(error.contains("type") && error.contains("code"));
  }
  // A 405 says what is allowed, a 401 how to authenticate (RFC 9110 asks both).
  const testing::HttpReply wrong_method = testing::http_request(server_->port(), "GET", "/v1/completions", "", api_key);
  EXPECT_EQ(wrong_method.status, 405);
  EXPECT_NE(wrong_method.headers.find("Allow: POST"), std::string::npos) << wrong_method.headers;
  const testing::HttpReply no_key = testing::http_request(server_->port(), "GET", "/v1/models", "", "");
  EXPECT_EQ(no_key.status, 401);
  EXPECT_NE(no_key.headers.find("WWW-Authenticate: Bearer"), std::string::npos) << no_key.headers;
  // A body over the 1 MiB limit: refused from its Content-Length, before it is read.
  testing::HttpReply large = testing::http_request(server_->port(), "POST", "/v1/completions",
                                                   std::string((1 << 20) + 1, ' '), api_key);
  EXPECT_EQ(large.status, 413);
  // JSON nested 100,000 deep: refused while parsing (echoing it back would overflow the stack).
  const std::string nested = R"({"prompt": [1, )" + std::string(100000, '[') + std::string(100000, ']') + "]}";
  const testing::HttpReply deep = testing::http_request(server_->port(), "POST", "/v1/completions", nested, api_key);
  EXPECT_EQ(deep.status, 400);
  EXPECT_NE(json::parse(deep.body)["error"]["message"].get<std::string>().find("deeper than 64"), std::string::npos);
  // A chunk extension without end: refused once it fills the read buffer, not read for 30 s.
  testing::Connection endless(server_->port());
  ASSERT_TRUE(endless.send(std::string("POST /v1/completions HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer ") + api_key +
                           "\r\nTransfer-Encoding: chunked\r\n\r\n1;" + std::string(100000, 'a')));
  EXPECT_EQ(testing::parse_reply(endless.receive_all(5s)).status, 400);
  EXPECT_EQ(testing::http_request(server_->port(), "GET", "/health").status, 200);  // still serving
}

// Half a request (its body, or its header), then a stall: 408 once the read timeout has passed,
// and the connection closes; a connection that sent nothing is closed without an answer.
TEST_F(ServeTest, HalfARequestThenAStallGets408) {
  testing::Connection stalled_body(server_->port()), stalled_header(server_->port()), idle(server_->port());
  ASSERT_TRUE(stalled_body.send("POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Length: 100\r\n\r\n{\"prompt\""));
  ASSERT_TRUE(stalled_header.send("POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Le"));
  const auto start = std::chrono::steady_clock::now();
  // Others are served meanwhile.
  EXPECT_EQ(completion({{"prompt", "the"}, {"max_tokens", 2}})["choices"].size(), 1u);
  for (testing::Connection* stalled : {&stalled_body, &stalled_header}) {
    bool closed = false;
    const testing::HttpReply reply = testing::parse_reply(stalled->receive_all(10s, &closed));
    const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    EXPECT_TRUE(closed);
    EXPECT_EQ(reply.status, 408) << reply.body;
    EXPECT_NE(reply.body.find("read timeout of 2 s"), std::string::npos) << reply.body;
    EXPECT_GE(seconds, 1.5);  // the read timeout is 2 s
    EXPECT_LE(seconds, 5.0);
  }
  bool closed = false;
  EXPECT_EQ(idle.receive_all(10s, &closed), "");
  EXPECT_TRUE(closed);
}

TEST_F(ServeTest, ManyIdleConnectionsCostNothingToOthers) {
  constexpr int count = 2000;
  // Each connection is a descriptor here too (the server raises its own limit).
  rlimit limit{};
  ASSERT_EQ(getrlimit(RLIMIT_NOFILE, &limit), 0);
  const rlim_t wanted = count + 256;
  ASSERT_GE(limit.rlim_max, wanted) << "the hard limit on open files is below " << wanted << " (ulimit -Hn)";
  if (limit.rlim_cur < wanted) {
    limit.rlim_cur = wanted;
    ASSERT_EQ(setrlimit(RLIMIT_NOFILE, &limit), 0);
  }
  std::vector<std::unique_ptr<testing::Connection>> idle;
  for (int i = 0; i < count; ++i) {
    idle.push_back(std::make_unique<testing::Connection>(server_->port()));
    ASSERT_TRUE(idle.back()->connected()) << i;
  }
  const auto start = std::chrono::steady_clock::now();
  EXPECT_EQ(completion({{"prompt", "the"}, {"max_tokens", 4}})["choices"].size(), 1u);
  EXPECT_LT(std::chrono::steady_clock::now() - start, 5s);
  EXPECT_GE(metric(metrics(), "paraflow_http_connections"), count);
  idle.clear();
}

TEST_F(ServeTest, ClientGoneMidStreamFreesItsRequest) {
  const double generated_before = metric(metrics(), "paraflow_generation_tokens_total");
  for (int i = 0; i < 3; ++i) {
    testing::Connection client(server_->port());
    const json request = {{"prompt", "the"}, {"max_tokens", 90}, {"stream", true}, {"temperature", 0}};
    ASSERT_TRUE(client.send(testing::request_text("POST", "/v1/completions", request.dump(), api_key)));
    std::string received;
    while (received.find("data: {") == std::string::npos && client.receive(received, 5s)) {
    }
    ASSERT_NE(received.find("data: {"), std::string::npos);
    client.close();
  }
  expect_engine_idle();
  // Cancelled, not run to the end: fewer than 3 × 90 tokens were generated.
  const double generated = metric(metrics(), "paraflow_generation_tokens_total") - generated_before;
  std::printf("  3 streams of 90 tokens cut off after their first chunk: %.0f tokens generated\n", generated);
  EXPECT_LT(generated, 3 * 90);
}

TEST_F(ServeTest, BurstBeyondTheQueueGets429) {
  std::atomic<int> ok{0}, limited{0}, other{0};
  std::vector<std::thread> clients;
  for (int i = 0; i < 24; ++i) {
    clients.emplace_back([&] {
      testing::HttpReply reply = post("/v1/completions", {{"prompt", "the"}, {"max_tokens", 60}});
      if (reply.status == 200) {
        ++ok;
      } else if (reply.status == 429 && json::parse(reply.body)["error"]["code"] == "rate_limit_exceeded" &&
                 reply.headers.find("Retry-After") != std::string::npos) {
        ++limited;
      } else {
        ++other;
      }
    });
  }
  for (std::thread& client : clients) client.join();
  std::printf("  24 at once: %d served, %d refused with 429\n", ok.load(), limited.load());
  EXPECT_GE(ok.load(), 4);
  EXPECT_GE(limited.load(), 1);
  EXPECT_EQ(other.load(), 0);
  expect_engine_idle();
}

// What `clients` send at once, `rounds` times each: every kind of request in turn, each checked
// for the answer it must get (one that generates may also be refused with 429 when the queue is full).
struct LoadResult {
  int generated = 0;  // completions answered 200
  int queue_full = 0;
  std::vector<std::string> problems;
};

LoadResult mixed_load(int port, int clients, int rounds) {
  const json stream = {{"prompt", "the"}, {"max_tokens", 12}, {"stream", true}};
  const json long_stream = {{"prompt", "the"}, {"max_tokens", 90}, {"stream", true}};
  // Large enough that a body kept after its request would show in the server's memory.
  const std::string malformed = R"({"prompt": ")" + std::string(256 << 10, 'a') + "\",";
  LoadResult result;
  std::mutex mutex;
  auto problem = [&](const std::string& what, const std::string& answer) {
    std::lock_guard lock(mutex);
    result.problems.push_back(fmt::format("{}: {}", what, answer.substr(0, 300)));
  };
  auto check = [&](const std::string& what, int status, const std::string& answer, bool generates, int expected) {
    if (status != expected && !(generates && status == 429)) {
      return problem(fmt::format("{}: status {} instead of {}", what, status, expected), answer);
    }
    std::lock_guard lock(mutex);
    (status == expected ? result.generated : result.queue_full) += generates;
  };
  // The status of a response whose beginning is `received` (0 when not even its status line came).
  auto status_of = [](const std::string& received) {
    return received.starts_with("HTTP/1.1 ") && received.size() >= 12 ? std::stoi(received.substr(9, 3)) : 0;
  };
  auto one_request = [&](int kind) {
    switch (kind) {
      case 0: {
        const testing::HttpReply reply = testing::http_request(
            port, "POST", "/v1/completions", json{{"prompt", "the lazy"}, {"max_tokens", 12}}.dump(), api_key);
        return check("completion", reply.status, reply.body, true, 200);
      }
      case 1: {
        const testing::HttpReply reply = testing::http_request(port, "POST", "/v1/completions", stream.dump(), api_key);
        if (reply.status == 200 && !reply.body.ends_with("data: [DONE]\n\n")) {
          return problem("a stream without its end", reply.body);
        }
        return check("stream", reply.status, reply.body, true, 200);
      }
      case 2: {  // the client hangs up after the first chunk
        testing::Connection client(port);
        client.send(testing::request_text("POST", "/v1/completions", long_stream.dump(), api_key));
        std::string received;
        const auto until = std::chrono::steady_clock::now() + 30s;
        while (received.find("data: {") == std::string::npos && std::chrono::steady_clock::now() < until &&
               client.receive(received, 100ms)) {
        }
        const int status = status_of(received);
        if (status == 200 && received.find("data: {") == std::string::npos) {
          return problem("a stream without chunks within 30 s", received);
        }
        return check("stream cut off", status, received, true, 200);
      }
      case 3: {
        const json chat = {{"messages", {{{"role", "user"}, {"content", "the quick"}}}}, {"max_tokens", 8}};
        const testing::HttpReply reply =
            testing::http_request(port, "POST", "/v1/chat/completions", chat.dump(), api_key);
        return check("chat", reply.status, reply.body, true, 200);
      }
      case 4: {
        const testing::HttpReply reply = testing::http_request(port, "POST", "/v1/completions", malformed, api_key);
        return check("malformed JSON", reply.status, reply.body, false, 400);
      }
      default: {  // a body over the limit, refused from its Content-Length
        testing::Connection client(port);
        client.send(fmt::format("POST /v1/completions HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer {}\r\n"
                                "Content-Length: {}\r\n\r\n",
                                api_key, 2 << 20));
        const std::string received = client.receive_all(30s);
        return check("body over the limit", status_of(received), received, false, 413);
      }
    }
  };
  std::vector<std::thread> threads;
  for (int c = 0; c < clients; ++c) {
    threads.emplace_back([&, c] {
      for (int i = 0; i < rounds; ++i) one_request((c + i) % 6);
    });
  }
  for (std::thread& thread : threads) thread.join();
  return result;
}

void expect_right_answers(const LoadResult& load) {
  for (const std::string& problem : load.problems) ADD_FAILURE() << problem;
}

TEST_F(ServeTest, MemoryReturnsToItsBaselineAfterLoad) {
  const pid_t pid = server_->process().pid();
  // Warm-up: the same mix, so that allocator pools, the graphs of each batch size and their
  // buffers exist before the baseline.
  expect_right_answers(mixed_load(server_->port(), 6, 6));
  expect_engine_idle();
  const int64_t baseline = resident_kib(pid);

  const LoadResult load = mixed_load(server_->port(), 6, 100);
  expect_right_answers(load);
  std::printf("  600 requests from 6 clients: %d completions served, %d refused with 429, %zu wrong answers\n",
              load.generated, load.queue_full, load.problems.size());
  EXPECT_GE(load.generated, 100);  // of 400 that generate
  expect_engine_idle();
  const int64_t after = resident_kib(pid);
  const double growth = static_cast<double>(after - baseline) / static_cast<double>(baseline);
  std::printf("  server RSS: %lld KiB after warm-up, %lld KiB after the load (%+.1f%%)\n",
              static_cast<long long>(baseline), static_cast<long long>(after), 100 * growth);
  EXPECT_LE(growth, 0.05);
}

// SIGTERM while a stream is in flight: the stream ends normally, then the server exits 0.
TEST(ServeShutdown, SigtermLetsTheStreamInFlightFinish) {
  testing::TempDir dir;
  export_tiny_model(dir.path());
  Server server(dir.path(), "--grace-seconds 30 --max-connections 3");
  testing::Connection client(server.port());
  const json request = {{"prompt", "the"}, {"max_tokens", 80}, {"stream", true}};
  // Kept alive: the connection stays one of the 3 even if the stream ends before the fourth comes.
  ASSERT_TRUE(client.send(testing::request_text("POST", "/v1/completions", request.dump(), "", true)));
  std::string received;
  while (received.find("data: {") == std::string::npos && client.receive(received, 5s)) {
  }
  // Connections beyond --max-connections are refused with 503 (this stream is one of 3).
  testing::Connection second(server.port()), third(server.port()), fourth(server.port());
  EXPECT_NE(fourth.receive_all(2s).find("503"), std::string::npos);

  server.process().signal(SIGTERM);
  bool closed = false;
  received += client.receive_all(60s, &closed);
  EXPECT_TRUE(closed);
  const testing::HttpReply reply = testing::parse_reply(received);
  std::vector<json> chunks = events(reply.body);
  ASSERT_FALSE(chunks.empty());
  EXPECT_EQ(chunks.back()["choices"][0]["finish_reason"], "length");
  const testing::Ended ended = server.process().wait(30s);
  EXPECT_EQ(ended.exit_code, 0) << ended.output;
  EXPECT_NE(ended.output.find("stopped"), std::string::npos) << ended.output;
}

// TF Serving's layout: version dirs under a base path, copied in as an exporter would (whole,
// by a rename), or cut short.
void add_version(const fs::path& model_dir, const fs::path& base, int64_t version, bool truncated = false) {
  const fs::path staging = base.parent_path() / fmt::format("staging-{}", version);
  fs::copy(model_dir, staging, fs::copy_options::recursive);
  const fs::path weights = staging / "model.safetensors";
  if (truncated) fs::resize_file(weights, fs::file_size(weights) / 2);
  fs::create_directories(base);
  fs::rename(staging, base / std::to_string(version));
}

// GET /v1/models/{name}: version -> state, with the error when there is one.
std::map<std::string, std::string> version_states(int port, const std::string& model) {
  const testing::HttpReply reply = testing::http_request(port, "GET", "/v1/models/" + model);
  std::map<std::string, std::string> states;
  if (reply.status != 200) return states;
  const json answer = json::parse(reply.body);
  for (const json& status : answer["model_version_status"]) {
    const std::string error = status["status"]["error_message"];
    states[status["version"]] = status["state"].get<std::string>() + (error.empty() ? "" : " " + error);
  }
  return states;
}

template <typename Condition>
bool eventually(Condition condition, std::chrono::seconds limit = 60s) {
  for (auto until = std::chrono::steady_clock::now() + limit; std::chrono::steady_clock::now() < until;) {
    if (condition()) return true;
    std::this_thread::sleep_for(50ms);
  }
  return false;
}

// Versions appear, one cut short, then fixed, while three clients keep asking: every request is
// answered, new requests go to each new version, the broken one is reported and never served.
TEST(ServeVersions, NewVersionsSwapInUnderLoadAndABrokenOneIsReported) {
  testing::TempDir dir;
  export_tiny_model(dir.path());
  const fs::path base = dir.path() / "base";
  add_version(dir.path() / "tiny-gpt", base, 1);
  Server server(dir.path(), "--file_system_poll_wait_seconds 0.2",
                fmt::format("--model_base_path {} --model_name gpt", base.string()));
  const int port = server.port();

  std::atomic<bool> stop{false};
  std::atomic<int> served{0};
  std::mutex mutex;
  std::vector<std::string> problems;
  std::vector<std::thread> clients;
  for (int i = 0; i < 3; ++i) {
    clients.emplace_back([&] {
      const std::string body = json{{"model", "gpt"}, {"prompt", "the quick"}, {"max_tokens", 8}}.dump();
      while (!stop) {
        const testing::HttpReply reply = testing::http_request(port, "POST", "/v1/completions", body);
        if (reply.status == 200 && json::parse(reply.body)["choices"][0]["text"].get<std::string>().size() > 0) {
          ++served;
        } else {
          std::lock_guard lock(mutex);
          problems.push_back(fmt::format("{}: {}", reply.status, reply.body));
        }
      }
    });
  }
  using States = std::map<std::string, std::string>;
  add_version(dir.path() / "tiny-gpt", base, 2);
  EXPECT_TRUE(eventually([&] { return version_states(port, "gpt") == States{{"1", "END"}, {"2", "AVAILABLE"}}; }))
      << server.log();
  const int served_before_the_broken_one = served;

  add_version(dir.path() / "tiny-gpt", base, 3, /*truncated=*/true);
  EXPECT_TRUE(eventually([&] { return version_states(port, "gpt")["3"].rfind("END ", 0) == 0; })) << server.log();
  const States states = version_states(port, "gpt");
  EXPECT_EQ(states.at("2"), "AVAILABLE");
  EXPECT_NE(states.at("3").find("model.safetensors"), std::string::npos) << states.at("3");
  std::printf("  version 3 cut short: %s\n", states.at("3").c_str());
  EXPECT_EQ(testing::http_request(port, "POST", "/v1/completions", json{{"model", "gpt:3"}, {"prompt", "the"}}.dump()).status, 404);
  EXPECT_EQ(version_states(port, "gpt/versions/3"), (States{{"3", states.at("3")}}));  // its own status, failed

  // The copy completed (the file replaced whole): tried again, and swapped in.
  fs::copy_file(dir.path() / "tiny-gpt" / "model.safetensors", base / "partial.safetensors");
  fs::rename(base / "partial.safetensors", base / "3" / "model.safetensors");
  EXPECT_TRUE(eventually([&] { return version_states(port, "gpt") == States{{"1", "END"}, {"2", "END"}, {"3", "AVAILABLE"}}; }))
      << server.log();
  const testing::HttpReply metadata = testing::http_request(port, "GET", "/v1/models/gpt/metadata");
  EXPECT_EQ(json::parse(metadata.body)["model_spec"]["version"], "3");
  EXPECT_EQ(testing::http_request(port, "POST", "/v1/completions", json{{"model", "gpt:3"}, {"prompt", "the"}}.dump()).status, 200);

  stop = true;
  for (std::thread& client : clients) client.join();
  std::printf("  %d completions served across 3 versions (%d before version 3 appeared), %zu failed\n", served.load(),
              served_before_the_broken_one, problems.size());
  EXPECT_GT(served_before_the_broken_one, 0);
  EXPECT_GT(served.load(), served_before_the_broken_one);
  EXPECT_TRUE(problems.empty()) << problems.front();
}

// Several models from TF Serving's model config file, with version policies and labels.
TEST(ServeVersions, AModelConfigFileServesSeveralModelsWithLabels) {
  testing::TempDir dir;
  export_tiny_model(dir.path());
  for (int64_t version : {1, 2, 3}) add_version(dir.path() / "tiny-gpt", dir.path() / "a", version);
  add_version(dir.path() / "tiny-gpt", dir.path() / "b", 7);
  const fs::path config = dir.path() / "models.config";
  std::ofstream(config) << fmt::format(R"(model_config_list {{
  config {{
    name: "a" base_path: "{}" model_platform: "tensorflow"
    model_version_policy {{ specific {{ versions: 1 versions: 2 }} }}
    version_labels {{ key: "stable" value: 1 }}
    version_labels {{ key: "canary" value: 2 }}
  }}
  config {{ name: "b" base_path: "{}" }}
}})", (dir.path() / "a").string(), (dir.path() / "b").string());
  Server server(dir.path(), "", "--model_config_file " + config.string());
  const int port = server.port();

  const json models = json::parse(testing::http_request(port, "GET", "/v1/models").body);
  EXPECT_EQ(models["data"][0]["id"], "a");
  EXPECT_EQ(models["data"][1]["id"], "b");
  EXPECT_EQ(version_states(port, "a"), (std::map<std::string, std::string>{{"1", "AVAILABLE"}, {"2", "AVAILABLE"}}));
  EXPECT_EQ(version_states(port, "b"), (std::map<std::string, std::string>{{"7", "AVAILABLE"}}));
  const testing::HttpReply canary = testing::http_request(port, "GET", "/v1/models/a/labels/canary");
  EXPECT_EQ(json::parse(canary.body)["model_version_status"][0]["version"], "2");
  for (const std::string model : {"a", "a:stable", "a:canary", "a:1", "b", "b:7"}) {
    const testing::HttpReply reply = testing::http_request(
        port, "POST", "/v1/completions", json{{"model", model}, {"prompt", "the"}, {"max_tokens", 4}}.dump());
    EXPECT_EQ(reply.status, 200) << model << ": " << reply.body;
    if (reply.status == 200) {
      EXPECT_EQ(json::parse(reply.body)["model"], model);
    }
  }
  for (const auto& [model, status] : std::vector<std::pair<std::string, int>>{{"a:3", 404}, {"a:beta", 404}, {"c", 404}}) {
    const testing::HttpReply reply = testing::http_request(
        port, "POST", "/v1/completions", json{{"model", model}, {"prompt", "the"}}.dump());
    EXPECT_EQ(reply.status, status) << model << ": " << reply.body;
  }
  const testing::HttpReply unnamed =
      testing::http_request(port, "POST", "/v1/completions", json{{"prompt", "the"}}.dump());
  EXPECT_EQ(unnamed.status, 400);
  EXPECT_EQ(json::parse(unnamed.body)["error"]["param"], "model");
  const std::string text = testing::http_request(port, "GET", "/metrics").body;
  for (const std::string series : {"model=\"a\",version=\"1\"", "model=\"a\",version=\"2\"", "model=\"b\",version=\"7\""}) {
    EXPECT_NE(text.find("paraflow_kv_blocks_total{" + series + "}"), std::string::npos) << series;
  }
}

// TF Serving's --enable_batching with its parameters file: eight :predict calls sent together
// fill one batch of max_batch_size rows, which runs at once (long before the timeout), as
// /metrics shows; each answer equals the same call made alone without batching.
TEST(ServeBatching, PredictCallsArrivingTogetherRunAsOneBatch) {
  testing::TempDir dir;
  export_tiny_model(dir.path());
  const fs::path parameters = dir.path() / "batching_parameters.txt";
  std::ofstream(parameters) << "max_batch_size { value: 8 }\nbatch_timeout_micros { value: 30000000 }\n"
                               "num_batch_threads { value: 4 }\n";
  Server batching(dir.path(), "--enable_batching --batching_parameters_file " + parameters.string());
  Server plain(dir.path(), "");
  auto predict = [](int port, int row) {
    const json body = {{"instances", {{{"input_ids", {116, 104, 101, 32 + row}}, {"max_new_tokens", 6}}}}};
    const testing::HttpReply reply =
        testing::http_request(port, "POST", "/v1/models/tiny-gpt:predict", body.dump(), "", 20s);
    EXPECT_EQ(reply.status, 200) << reply.body;
    return reply.status == 200 ? json::parse(reply.body)["predictions"][0] : json();
  };
  // The calls give up after 20 s: a full batch must not wait for the 30 s timeout.
  std::vector<std::future<json>> answers;
  for (int row = 0; row < 8; ++row) answers.push_back(std::async(std::launch::async, predict, batching.port(), row));
  for (int row = 0; row < 8; ++row) EXPECT_EQ(answers[row].get(), predict(plain.port(), row)) << row;
  const std::string text = testing::http_request(batching.port(), "GET", "/metrics").body;
  EXPECT_EQ(metric(text, "paraflow_predict_batch_size_count"), 1) << text;
  EXPECT_EQ(metric(text, "paraflow_predict_batch_size_sum"), 8) << text;
}

}  // namespace
}  // namespace paraflow
