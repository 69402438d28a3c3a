#include "serve/request_reading.h"

#include <fmt/format.h>

namespace paraflow::serve {

namespace http = boost::beast::http;

void apply_limits(RequestParser& parser, const HttpLimits& limits) {
  parser.body_limit(limits.body_bytes);
  parser.header_limit(static_cast<uint32_t>(limits.header_bytes));
}

size_t read_buffer_bytes(const HttpLimits& limits) { return limits.header_bytes + kReadChunkBytes; }

std::optional<Refusal> refuse_header(const RequestParser& parser, const HttpLimits& limits) {
  if (parser.content_length() && *parser.content_length() > limits.body_bytes) {
    return Refusal{413, fmt::format("the request body is {} bytes; the limit is {}", *parser.content_length(),
                                    limits.body_bytes)};
  }
  return std::nullopt;
}

std::optional<Refusal> refuse_read_error(boost::beast::error_code error, const HttpLimits& limits) {
  if (error == http::error::body_limit) {
    return Refusal{413, fmt::format("the request body is over the limit of {} bytes", limits.body_bytes)};
  }
  if (error == http::error::header_limit) {
    return Refusal{431, fmt::format("the request headers are over the limit of {} bytes", limits.header_bytes)};
  }
  if (error == http::error::buffer_overflow) {
    return Refusal{400, fmt::format("malformed HTTP request: a chunk header or trailer over {} bytes",
                                    read_buffer_bytes(limits))};
  }
  const bool parse_error = error.category() == boost::beast::error_code(http::error::bad_target).category() &&
                           error != http::error::end_of_stream && error != http::error::partial_message;
  if (parse_error) return Refusal{400, fmt::format("malformed HTTP request: {}", error.message())};
  return std::nullopt;
}

Refusal request_timeout(const HttpLimits& limits) {
  return {408, fmt::format("the request was not received whole within the read timeout of {:g} s (--read-timeout)",
                           std::chrono::duration<double>(limits.read_timeout).count())};
}

HttpRequest plain_request(RequestMessage message) {
  return {.method = std::string(message.method_string()),
          .target = std::string(message.target()),
          .authorization = std::string(message[http::field::authorization]),
          .origin = std::string(message[http::field::origin]),
          .access_control_request_method = std::string(message[http::field::access_control_request_method]),
          .access_control_request_headers = std::string(message[http::field::access_control_request_headers]),
          .body = std::move(message.body())};
}

}  // namespace paraflow::serve
