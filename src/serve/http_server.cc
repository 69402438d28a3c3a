#include "serve/http_server.h"

#include <fmt/format.h>

#include <array>
#include <atomic>
#include <boost/asio.hpp>
#include <boost/asio/ssl.hpp>
#include <boost/beast/core.hpp>
#include <boost/beast/http.hpp>
#include <boost/beast/ssl.hpp>
#include <deque>
#include <optional>
#include <sstream>
#include <thread>

#include "base/error.h"
#include "serve/api_error.h"
#include "serve/request_reading.h"

namespace paraflow::serve {

namespace net = boost::asio;
namespace beast = boost::beast;
namespace http = beast::http;
namespace ssl = net::ssl;
using tcp = net::ip::tcp;
using TlsStream = beast::ssl_stream<beast::tcp_stream>;

namespace {

// A whole response (status line, headers, body) as bytes to write.
template <typename Message>
std::string serialize(const Message& message) {
  std::ostringstream text;
  text << message;
  return text.str();
}

std::string error_response(int status, const std::string& message) {
  http::response<http::string_body> response{static_cast<http::status>(status), 11};
  response.set(http::field::content_type, "application/json");
  response.body() = ApiError(status, status >= 500 ? "server_error" : "invalid_request_error", message).body();
  response.keep_alive(false);
  response.prepare_payload();
  return serialize(response);
}

// What sessions share with the server.
struct ServerCore {
  HttpHandler handler;
  StatusObserver observer;
  HttpLimits limits;
  std::optional<ssl::context> tls;  // HTTPS when set (use_tls)
  std::atomic<size_t> connections{0};
  std::atomic<size_t> answering{0};  // answers begun and not yet sent (or abandoned)
};

}  // namespace

struct HttpServer::Impl : ServerCore {
  // Declared after the counters: the sessions the io_context's destructor destroys count themselves out.
  std::unique_ptr<net::io_context> io;
  std::optional<tcp::acceptor> acceptor;
  std::vector<std::thread> threads;

  void accept();
  void refuse_connection(tcp::socket socket);
};

namespace {

// One connection: read a request, hand it to the handler, write its answer, and again while the
// client keeps the connection alive. Runs on its strand; Exchange calls are posted to it. `Stream`
// is TCP, or TLS over TCP (HTTPS), which begins with the handshake.
template <typename Stream>
class Session : public std::enable_shared_from_this<Session<Stream>> {
  static constexpr bool kTls = std::is_same_v<Stream, TlsStream>;

 public:
  template <typename... TlsContext>
  Session(tcp::socket socket, ServerCore& server, TlsContext&... context)
      : stream_(std::move(socket), context...),
        read_deadline_(stream_.get_executor()),
        server_(server),
        buffer_(read_buffer_bytes(server.limits)) {
    ++server_.connections;
  }
  ~Session() { --server_.connections; }

  void start() {
    if constexpr (!kTls) {
      read_request();
    } else {
      tcp().expires_after(server_.limits.read_timeout);
      stream_.async_handshake(ssl::stream_base::server, [self = this->shared_from_this()](beast::error_code error) {
        self->tcp().expires_never();
        if (error) return self->close();  // not TLS, an untrusted certificate, or too slow
        self->read_request();
      });
    }
  }

  void read_request() {
    apply_limits(parser_.emplace(), server_.limits);
    start_read_deadline();
    http::async_read_header(stream_, buffer_, *parser_,
                            [self = this->shared_from_this()](beast::error_code error, size_t) { self->on_header(error); });
  }

  // Exchange calls, posted here by Answer. `serial` names the answer they belong to.
  void respond(uint64_t serial, int status, const std::string& content_type, std::string body,
               const HttpHeaders& headers) {
    if (serial != serial_) return;
    http::response<http::string_body> response{static_cast<http::status>(status), version_};
    response.set(http::field::content_type, content_type);
    for (const auto& [name, value] : headers) response.set(name, value);
    response.keep_alive(keep_alive_);
    response.body() = std::move(body);
    response.prepare_payload();
    server_.observer(target_, status);
    // HEAD: the header a GET would get (its Content-Length too) and no body, which the client
    // does not read: a body would be taken for the start of the next answer.
    queue(head_ ? serialize(response.base()) : serialize(response), true);
  }
  void start_stream(uint64_t serial, const std::string& content_type, const HttpHeaders& headers) {
    if (serial != serial_) return;
    http::response<http::empty_body> response{http::status::ok, version_};
    response.set(http::field::content_type, content_type);
    for (const auto& [name, value] : headers) response.set(name, value);
    response.set(http::field::cache_control, "no-cache");
    // HTTP/1.0 has no chunked encoding: the body is the bytes until the connection closes.
    if (!chunked()) keep_alive_ = false;
    response.keep_alive(keep_alive_);
    response.chunked(chunked());
    server_.observer(target_, 200);
    queue(serialize(response.base()), false);
  }
  void send(uint64_t serial, const std::string& data) {
    if (serial != serial_ || data.empty()) return;  // an empty chunk would end the body
    queue(chunked() ? fmt::format("{:x}\r\n{}\r\n", data.size(), data) : data, false);
  }
  void end_stream(uint64_t serial) {
    if (serial == serial_) queue(chunked() ? "0\r\n\r\n" : "", true);
  }
  void on_disconnect(uint64_t serial, std::function<void()> callback) {
    if (serial != serial_) return;
    if (closed_) {
      callback();
    } else {
      disconnect_callback_ = std::move(callback);
    }
  }
  // The exchange was dropped unanswered: nothing more can be said on this connection.
  void abandon(uint64_t serial) {
    if (serial != serial_) return;
    keep_alive_ = false;
    answer_complete_ = true;
    close();
    if (!writing_) write_next();
  }

  net::any_io_executor executor() { return stream_.get_executor(); }

 private:
  bool chunked() const { return version_ >= 11; }  // a streamed body's framing

  // The read timeout, for the header and the body together. Its own timer rather than the
  // stream's expiry, which would close the socket: a request cut off is answered 408.
  void start_read_deadline() {
    reading_ = true;
    timed_out_ = false;
    read_deadline_.expires_after(server_.limits.read_timeout);
    read_deadline_.async_wait([self = this->shared_from_this(), serial = serial_](beast::error_code error) {
      if (error || !self->reading_ || serial != self->serial_) return;  // cancelled, or that read is over
      self->timed_out_ = true;
      beast::error_code ignored;
      self->tcp().socket().cancel(ignored);  // the read ends with operation_aborted
    });
  }
  void end_read_deadline() {
    reading_ = false;
    read_deadline_.cancel();
  }
  void on_header(beast::error_code error) {
    if (error) return on_read_error(error);
    if (auto refusal = refuse_header(*parser_, server_.limits)) return answer_alone(*refusal);
    if (beast::iequals(parser_->get()[http::field::expect], "100-continue")) {
      // The client waits for this before sending the body (curl does for large bodies).
      auto interim = std::make_shared<std::string>("HTTP/1.1 100 Continue\r\n\r\n");
      net::async_write(stream_, net::buffer(*interim),
                       [self = this->shared_from_this(), interim](beast::error_code error, size_t) {
                         if (error) return self->close();
                         self->read_body();
                       });
      return;
    }
    read_body();
  }

  void read_body() {
    http::async_read(stream_, buffer_, *parser_,
                     [self = this->shared_from_this()](beast::error_code error, size_t) { self->on_request(error); });
  }

  void on_read_error(beast::error_code error) {
    end_read_deadline();
    // A request begun and not finished in time is told so; an idle kept-alive connection just closes.
    if (timed_out_ && (buffer_.size() > 0 || parser_->got_some())) return answer_alone(request_timeout(server_.limits));
    if (auto refusal = refuse_read_error(error, server_.limits)) return answer_alone(*refusal);
    close();  // the client left, stalled past the read timeout, or the connection failed
  }

  void on_request(beast::error_code error) {
    if (error) return on_read_error(error);
    end_read_deadline();
    RequestMessage request = parser_->release();
    keep_alive_ = request.keep_alive();
    version_ = request.version() >= 11 ? 11 : 10;  // answered in the request's version
    target_ = std::string(request.target());
    head_ = request.method() == http::verb::head;
    ++server_.answering;
    watch_for_disconnect();
    server_.handler(plain_request(std::move(request)), make_exchange());
  }

  std::shared_ptr<Exchange> make_exchange();

  // A refusal the server makes itself, before any handler: answered, then the connection closes.
  void answer_alone(const Refusal& refusal) {
    end_read_deadline();
    keep_alive_ = false;
    target_ = parser_ && parser_->is_header_done() ? std::string(parser_->get().target()) : "";
    ++server_.answering;
    server_.observer(target_, refusal.status);
    queue(error_response(refusal.status, refusal.message), true);
  }

  // While an answer is being prepared nothing is read, so watch the socket: readable with nothing
  // to read means the client closed it (an answer for no one: the handler's callback cancels the work).
  void watch_for_disconnect() {
    auto on_readable = [self = this->shared_from_this(), serial = serial_](beast::error_code error) {
      if (serial != self->serial_ || self->closed_) return;  // that answer is done
      if (!error) {
        tcp::socket& socket = self->tcp().socket();
        char byte = 0;
        socket.non_blocking(true, error);
        const size_t peeked = socket.receive(net::buffer(&byte, 1), tcp::socket::message_peek, error);
        if (error == net::error::would_block) return self->watch_for_disconnect();
        if (!error && peeked > 0) return;  // a pipelined request: read after this answer
      }
      self->close();
    };
    tcp().socket().async_wait(tcp::socket::wait_read, std::move(on_readable));
  }

  void queue(std::string bytes, bool last) {
    if (last) answer_complete_ = true;
    if (!closed_) writes_.push_back(std::move(bytes));
    if (!writing_) write_next();
  }

  void write_next() {
    if (closed_) writes_.clear();
    if (writes_.empty()) {
      if (answer_complete_) finish_answer();
      return;
    }
    writing_ = true;
    tcp().expires_after(server_.limits.write_timeout);
    net::async_write(stream_, net::buffer(writes_.front()), [self = this->shared_from_this()](beast::error_code error, size_t) {
      self->writing_ = false;
      self->tcp().expires_never();
      if (error) {
        self->writes_.clear();
        self->close();
      } else {
        self->writes_.pop_front();
      }
      self->write_next();
    });
  }

  void finish_answer() {
    answer_complete_ = false;
    disconnect_callback_ = nullptr;
    ++serial_;
    --server_.answering;
    if (closed_) return;
    if (keep_alive_) return read_request();
    tcp().expires_after(server_.limits.linger);
    if constexpr (kTls) {
      // TLS's close_notify, then the client's: the TLS layer reads and drops what comes before it.
      stream_.async_shutdown([self = this->shared_from_this()](beast::error_code) { self->close(); });
    } else {
      beast::error_code ignored;
      tcp().socket().shutdown(tcp::socket::shutdown_send, ignored);
      discard_until_closed();
    }
  }

  // Closing a socket with unread bytes in it sends a reset, which can destroy the answer in the
  // client's receive buffer: read what the client still sends until it closes or the linger ends.
  void discard_until_closed() {
    stream_.async_read_some(net::buffer(discarded_), [self = this->shared_from_this()](beast::error_code error, size_t) {
      if (error) return self->close();
      self->discard_until_closed();
    });
  }

  void close() {
    if (closed_) return;
    closed_ = true;
    read_deadline_.cancel();
    beast::error_code ignored;
    tcp().socket().close(ignored);
    if (auto callback = std::move(disconnect_callback_)) callback();
  }

  beast::tcp_stream& tcp() { return beast::get_lowest_layer(stream_); }

  Stream stream_;
  net::steady_timer read_deadline_;
  bool reading_ = false;    // a request is being read, under the read deadline
  bool timed_out_ = false;  // the deadline cut the read off
  ServerCore& server_;
  beast::flat_buffer buffer_;  // bounded: the bytes read but not yet parsed
  std::optional<RequestParser> parser_;
  std::array<char, 4096> discarded_;
  std::string target_;
  bool keep_alive_ = false;
  unsigned version_ = 11;  // the request's HTTP version, 10 or 11, which the answer takes
  bool head_ = false;  // the request being answered is a HEAD
  uint64_t serial_ = 0;  // the answer in progress; calls for earlier ones are ignored
  std::deque<std::string> writes_;
  bool writing_ = false;
  bool answer_complete_ = false;  // its last bytes are queued
  bool closed_ = false;
  std::function<void()> disconnect_callback_;
};

// An Exchange posts every call to its session's strand.
template <typename Stream>
class Answer : public Exchange {
  using Session = paraflow::serve::Session<Stream>;

 public:
  Answer(std::shared_ptr<Session> session, uint64_t serial) : session_(std::move(session)), serial_(serial) {}
  ~Answer() override {
    if (!finished_) post([](Session& session, uint64_t serial) { session.abandon(serial); });
  }
  void respond(int status, const std::string& content_type, std::string body, HttpHeaders headers) override {
    finished_ = true;
    post([=, body = std::move(body)](Session& session, uint64_t serial) mutable {
      session.respond(serial, status, content_type, std::move(body), headers);
    });
  }
  void start_stream(const std::string& content_type, HttpHeaders headers) override {
    post([=](Session& session, uint64_t serial) { session.start_stream(serial, content_type, headers); });
  }
  void send(std::string data) override {
    post([data = std::move(data)](Session& session, uint64_t serial) { session.send(serial, data); });
  }
  void end_stream() override {
    finished_ = true;
    post([](Session& session, uint64_t serial) { session.end_stream(serial); });
  }
  void on_disconnect(std::function<void()> callback) override {
    post([callback = std::move(callback)](Session& session, uint64_t serial) mutable {
      session.on_disconnect(serial, std::move(callback));
    });
  }

 private:
  template <typename Call>
  void post(Call call) {
    net::post(session_->executor(), [session = session_, serial = serial_, call = std::move(call)]() mutable {
      call(*session, serial);
    });
  }
  std::shared_ptr<Session> session_;
  uint64_t serial_;
  std::atomic<bool> finished_{false};
};

template <typename Stream>
std::shared_ptr<Exchange> Session<Stream>::make_exchange() {
  return std::make_shared<Answer<Stream>>(this->shared_from_this(), serial_);
}

// with_headers(): forwards every call, adding its headers to the answer's.
class WithHeaders : public Exchange {
 public:
  WithHeaders(std::shared_ptr<Exchange> exchange, HttpHeaders headers)
      : exchange_(std::move(exchange)), headers_(std::move(headers)) {}
  void respond(int status, const std::string& content_type, std::string body, HttpHeaders headers) override {
    exchange_->respond(status, content_type, std::move(body), joined(std::move(headers)));
  }
  void start_stream(const std::string& content_type, HttpHeaders headers) override {
    exchange_->start_stream(content_type, joined(std::move(headers)));
  }
  void send(std::string data) override { exchange_->send(std::move(data)); }
  void end_stream() override { exchange_->end_stream(); }
  void on_disconnect(std::function<void()> callback) override { exchange_->on_disconnect(std::move(callback)); }

 private:
  HttpHeaders joined(HttpHeaders headers) const {
    headers.insert(headers.end(), headers_.begin(), headers_.end());
    return headers;
  }
  std::shared_ptr<Exchange> exchange_;
  HttpHeaders headers_;
};

}  // namespace

std::shared_ptr<Exchange> with_headers(std::shared_ptr<Exchange> exchange, HttpHeaders headers) {
  return std::make_shared<WithHeaders>(std::move(exchange), std::move(headers));
}

void HttpServer::Impl::accept() {
  acceptor->async_accept(net::make_strand(*io), [this](beast::error_code error, tcp::socket socket) {
    if (error == net::error::operation_aborted || !acceptor->is_open()) return;
    if (error) {
      // Out of file descriptors, most likely: let connections close before trying again.
      auto timer = std::make_shared<net::steady_timer>(acceptor->get_executor(), std::chrono::milliseconds(50));
      timer->async_wait([this, timer](beast::error_code) { accept(); });
      return;
    }
    if (connections.load() >= limits.max_connections) {
      refuse_connection(std::move(socket));
    } else {
      // A streamed token goes out when written, not held back until the previous one is
      // acknowledged (Nagle's algorithm).
      beast::error_code ignored;
      socket.set_option(tcp::no_delay(true), ignored);
      if (tls) {
        std::make_shared<Session<TlsStream>>(std::move(socket), *this, *tls)->start();
      } else {
        std::make_shared<Session<beast::tcp_stream>>(std::move(socket), *this)->start();
      }
    }
    accept();
  });
}

void HttpServer::Impl::refuse_connection(tcp::socket socket) {
  if (tls) return;  // a plain-text answer means nothing to a TLS client: just closed
  // A short answer fits the socket's send buffer: written without waiting, then closed.
  const std::string response =
      error_response(503, fmt::format("too many connections (the limit is {}); try again later", limits.max_connections));
  observer("", 503);
  beast::error_code ignored;
  socket.non_blocking(true, ignored);
  socket.write_some(net::buffer(response), ignored);
  socket.shutdown(tcp::socket::shutdown_send, ignored);
  socket.close(ignored);
}

HttpServer::HttpServer(HttpHandler handler, StatusObserver observer, const HttpLimits& limits)
    : impl_(std::make_unique<Impl>()) {
  impl_->handler = std::move(handler);
  impl_->observer = std::move(observer);
  impl_->limits = limits;
  impl_->io = std::make_unique<net::io_context>(limits.io_threads);
}

HttpServer::~HttpServer() {
  stop(std::chrono::milliseconds(0));
  impl_->acceptor.reset();
  impl_->io.reset();  // destroys the sessions still waiting on it
}

void HttpServer::listen(const std::string& host, uint16_t port) {
  beast::error_code error;
  tcp::resolver resolver(*impl_->io);
  const auto endpoints = resolver.resolve(host, std::to_string(port), error);
  if (error || endpoints.empty()) throw IoError(fmt::format("cannot resolve --host {}: {}", host, error.message()));
  const tcp::endpoint endpoint = endpoints.begin()->endpoint();
  tcp::acceptor& acceptor = impl_->acceptor.emplace(net::make_strand(*impl_->io));
  acceptor.open(endpoint.protocol(), error);
  if (!error) acceptor.set_option(net::socket_base::reuse_address(true), error);
  if (!error) acceptor.bind(endpoint, error);
  if (!error) acceptor.listen(net::socket_base::max_listen_connections, error);
  if (error) throw IoError(fmt::format("cannot listen on {}:{}: {}", host, port, error.message()));
  impl_->accept();
  for (int i = 0; i < impl_->limits.io_threads; ++i) impl_->threads.emplace_back([this] { impl_->io->run(); });
}

void HttpServer::use_tls(const std::string& certfile, const std::string& keyfile) {
  ssl::context& context = impl_->tls.emplace(ssl::context::tls_server);
  context.set_options(ssl::context::default_workarounds | ssl::context::no_sslv2 | ssl::context::no_sslv3 |
                      ssl::context::no_tlsv1 | ssl::context::no_tlsv1_1 | ssl::context::single_dh_use);
  beast::error_code error;
  context.use_certificate_chain_file(certfile, error);
  if (error) throw InputError(fmt::format("--ssl-certfile {}: not a PEM certificate chain ({})", certfile, error.message()));
  context.use_private_key_file(keyfile, ssl::context::pem, error);
  if (error) {
    throw InputError(fmt::format("--ssl-keyfile {}: not the PEM private key of --ssl-certfile {} ({})", keyfile,
                                 certfile, error.message()));
  }
}

uint16_t HttpServer::port() const { return impl_->acceptor->local_endpoint().port(); }

size_t HttpServer::connections() const { return impl_->connections.load(); }

void HttpServer::stop_accepting() {
  if (!impl_->acceptor) return;
  net::post(impl_->acceptor->get_executor(), [this] {
    beast::error_code ignored;
    impl_->acceptor->close(ignored);
  });
}

void HttpServer::stop(std::chrono::milliseconds timeout) {
  if (impl_->threads.empty()) return;
  stop_accepting();
  const auto until = std::chrono::steady_clock::now() + timeout;
  while (impl_->answering.load() > 0 && std::chrono::steady_clock::now() < until) {
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  impl_->io->stop();
  for (std::thread& thread : impl_->threads) thread.join();
  impl_->threads.clear();
}

}  // namespace paraflow::serve
