// libFuzzer target for the server's request handling short of the model: any bytes, as a client
// sends them on a connection it then closes, are read as the server reads them (Beast's parser
// under the server's limits, its own refusals), each request routed as the service routes it
// (API key, path, method) and a completion's body decoded. Each request must end routed, refused
// with 400, 413 or 431, or as an ApiError with a 4xx status and a JSON body; or, incomplete, with
// the connection closed. Nothing may crash, hang or read out of bounds.
//   scripts/fuzz.sh http_request 60      # 60 seconds
#include <algorithm>
#include <boost/asio/buffer.hpp>
#include <boost/asio/error.hpp>
#include <boost/beast/core/flat_buffer.hpp>
#include <cstddef>
#include <cstdint>
#include <nlohmann/json.hpp>
#include <optional>
#include <string_view>

#include "serve/api_error.h"
#include "serve/openai_request.h"
#include "serve/request_reading.h"
#include "serve/router.h"

namespace {

using namespace paraflow::serve;
namespace http = boost::beast::http;

// A connection's bytes, arriving in pieces of at most 7 (so that the parser resumes anywhere), then EOF.
class ByteStream {
 public:
  explicit ByteStream(std::string_view bytes) : bytes_(bytes) {}
  template <typename Buffers>
  size_t read_some(const Buffers& buffers, boost::beast::error_code& error) {
    if (bytes_.empty()) {
      error = boost::asio::error::eof;
      return 0;
    }
    error = {};
    const size_t piece = std::min<size_t>(bytes_.size(), 7);
    const size_t copied = boost::asio::buffer_copy(buffers, boost::asio::buffer(bytes_.data(), piece));
    bytes_.remove_prefix(copied);
    return copied;
  }
  template <typename Buffers>
  size_t read_some(const Buffers& buffers) {
    boost::beast::error_code error;
    const size_t copied = read_some(buffers, error);
    if (error) throw boost::system::system_error(error);
    return copied;
  }

 private:
  std::string_view bytes_;
};

void check_api_error(const ApiError& error) {
  if (error.status() < 400 || error.status() > 499) __builtin_trap();
  (void)nlohmann::json::parse(error.body());  // throws (a crash here) if the error is not JSON
}

void handle(const HttpRequest& request) {
  try {
    const Endpoint endpoint = route(request, "key");
    (void)endpoint_label(request.target);
    if (endpoint == Endpoint::completions) decode_completion_request(request.body);
    if (endpoint == Endpoint::chat_completions) chat_prompt(decode_chat_request(request.body).messages);
  } catch (const ApiError& error) {
    check_api_error(error);
  }
}

// True when the connection goes on to its next request.
bool read_one(ByteStream& stream, boost::beast::flat_buffer& buffer, const HttpLimits& limits) {
  RequestParser parser;
  apply_limits(parser, limits);
  boost::beast::error_code error;
  http::read_header(stream, buffer, parser, error);
  std::optional<Refusal> refusal = error ? refuse_read_error(error, limits) : refuse_header(parser, limits);
  if (!error && !refusal) {
    http::read(stream, buffer, parser, error);
    if (error) refusal = refuse_read_error(error, limits);
  }
  if (refusal) {
    if (refusal->status != 400 && refusal->status != 413 && refusal->status != 431) __builtin_trap();
    check_api_error(ApiError(refusal->status, "invalid_request_error", refusal->message));
    return false;
  }
  if (error) return false;  // incomplete: the connection closes
  RequestMessage message = parser.release();
  const bool keep_alive = message.keep_alive();
  handle(plain_request(std::move(message)));
  return keep_alive;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const HttpLimits limits{.body_bytes = 4096, .header_bytes = 1024};
  ByteStream stream(std::string_view(reinterpret_cast<const char*>(data), size));
  boost::beast::flat_buffer buffer;
  while (read_one(stream, buffer, limits)) {
  }
  return 0;
}
