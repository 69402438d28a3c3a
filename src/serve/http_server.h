// HTTP/1.1 over Boost.Beast, asynchronous: connections wait in the io threads' event loop, so an
// idle one costs a socket and a little memory, not a thread. It knows nothing of the API: each
// complete request goes to the handler with an Exchange to answer through, from any thread.
// With use_tls(), HTTPS: each connection starts with the TLS handshake (within the read timeout).
//
// Limits: a request must arrive whole within the read timeout (so must the next one on a kept-alive
// connection: a client that sends half a request and stalls gets 408 and the connection closes; an
// idle one is just closed), bodies and headers have size limits (413, 431), connections beyond the
// maximum get 503 and are closed (over TLS, only closed).
#pragma once

#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <utility>
#include <vector>

namespace paraflow::serve {

struct HttpLimits {
  size_t body_bytes = size_t{1} << 20;
  size_t header_bytes = size_t{16} << 10;
  std::chrono::milliseconds read_timeout{30'000};   // to receive a whole request, or the next one
  std::chrono::milliseconds write_timeout{30'000};  // to send each piece of an answer
  // After a last answer, how long what the client still sends is read and dropped, so that
  // closing does not reset the connection before the client has read the answer (a 413 to a
  // client still sending its body, for one).
  std::chrono::milliseconds linger{2'000};
  size_t max_connections = 4096;
  int io_threads = 2;
};

struct HttpRequest {
  std::string method;
  std::string target;
  std::string authorization;  // the Authorization header
  // A browser's cross-origin headers (serve/cors.h): Origin, and a preflight's Access-Control-Request-*.
  std::string origin;
  std::string access_control_request_method;
  std::string access_control_request_headers;
  std::string body;
};

using HttpHeaders = std::vector<std::pair<std::string, std::string>>;

// One request's answer: respond() once, or start_stream(), send() any number of times, then
// end_stream(). Thread-safe; what is sent goes out in call order. An exchange dropped unanswered
// closes its connection.
class Exchange {
 public:
  virtual ~Exchange() = default;
  virtual void respond(int status, const std::string& content_type, std::string body, HttpHeaders headers = {}) = 0;
  virtual void start_stream(const std::string& content_type, HttpHeaders headers = {}) = 0;  // 200, chunked
  virtual void send(std::string data) = 0;
  virtual void end_stream() = 0;
  // `callback` runs once, on an io thread, if the client goes away before the answer is sent (at
  // once if it already has).
  virtual void on_disconnect(std::function<void()> callback) = 0;
};

// An exchange whose answer, whole or streamed, also carries `headers`.
std::shared_ptr<Exchange> with_headers(std::shared_ptr<Exchange> exchange, HttpHeaders headers);

using HttpHandler = std::function<void(HttpRequest request, std::shared_ptr<Exchange> exchange)>;
// Sees the status of every answer, the server's own refusals (400, 413, 431, 503) included; their
// target is empty when the request line was not read.
using StatusObserver = std::function<void(const std::string& target, int status)>;

class HttpServer {
 public:
  HttpServer(HttpHandler handler, StatusObserver observer, const HttpLimits& limits);
  ~HttpServer();  // stop(0), then closes what is left
  HttpServer(const HttpServer&) = delete;
  HttpServer& operator=(const HttpServer&) = delete;

  // HTTPS: TLS with this PEM certificate chain and private key, before listen(). Throws InputError
  // naming --ssl-certfile or --ssl-keyfile when they cannot be read or do not match.
  void use_tls(const std::string& certfile, const std::string& keyfile);
  // Binds, listens and starts the io threads. Throws IoError when the address cannot be bound.
  void listen(const std::string& host, uint16_t port);
  uint16_t port() const;     // the bound port (the one the system chose for port 0)
  size_t connections() const;
  void stop_accepting();
  // Waits up to `timeout` for the answers in progress to be sent, then stops the io threads.
  void stop(std::chrono::milliseconds timeout);

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace paraflow::serve
