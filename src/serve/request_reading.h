// Reading a request, apart from the socket (http_server.cc reads from one, the request fuzz target
// from bytes): Beast's parser under the server's limits, the refusals the server makes itself
// before any handler (400, 413, 431), and the parsed message as the handler's HttpRequest.
#pragma once

#include <boost/beast/http.hpp>
#include <optional>
#include <string>

#include "serve/http_server.h"

namespace paraflow::serve {

using RequestMessage = boost::beast::http::request<boost::beast::http::string_body>;
using RequestParser = boost::beast::http::request_parser<boost::beast::http::string_body>;

struct Refusal {
  int status;
  std::string message;
};

void apply_limits(RequestParser& parser, const HttpLimits& limits);
// The connection's read buffer holds what is read but not yet parsed: a header, or a chunk's
// header or the trailers, which Beast's limits do not count. Bounded, so that a chunk extension
// or trailer without end is refused (400) instead of growing the buffer until the read timeout.
constexpr size_t kReadChunkBytes = size_t{8} << 10;
size_t read_buffer_bytes(const HttpLimits& limits);
// Once the header is read: a body declared over the limit is refused before it is read (413).
std::optional<Refusal> refuse_header(const RequestParser& parser, const HttpLimits& limits);
// A read that failed: a request over a limit or malformed is refused (413, 431, 400); none when the
// client left, stalled or the connection failed: the connection just closes.
std::optional<Refusal> refuse_read_error(boost::beast::error_code error, const HttpLimits& limits);
// A request begun and not received whole within the read timeout (408).
Refusal request_timeout(const HttpLimits& limits);
// The whole request as the handler sees it.
HttpRequest plain_request(RequestMessage message);

}  // namespace paraflow::serve
