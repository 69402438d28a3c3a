// A small HTTP/1.1 client over raw sockets for the server tests: it can also misbehave (send half
// a request, stall, hang up mid-stream), which ordinary clients will not do.
#pragma once

#include <arpa/inet.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <chrono>
#include <cstdint>
#include <string>
#include <string_view>

namespace paraflow::testing {

class Connection {
 public:
  explicit Connection(int port) : fd_(socket(AF_INET, SOCK_STREAM, 0)) {
    sockaddr_in address{};
    address.sin_family = AF_INET;
    address.sin_port = htons(static_cast<uint16_t>(port));
    address.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    connected_ = connect(fd_, reinterpret_cast<sockaddr*>(&address), sizeof address) == 0;
  }
  ~Connection() { close(); }
  Connection(const Connection&) = delete;
  Connection& operator=(const Connection&) = delete;

  bool connected() const { return connected_; }
  void close() {
    if (fd_ >= 0) ::close(fd_);
    fd_ = -1;
  }
  bool send(std::string_view bytes) {
    while (!bytes.empty()) {
      const ssize_t sent = ::send(fd_, bytes.data(), bytes.size(), MSG_NOSIGNAL);
      if (sent <= 0) return false;
      bytes.remove_prefix(static_cast<size_t>(sent));
    }
    return true;
  }
  // Appends what arrives within `timeout` to `received`; false once the server has closed.
  bool receive(std::string& received, std::chrono::milliseconds timeout) {
    pollfd ready{fd_, POLLIN, 0};
    if (poll(&ready, 1, static_cast<int>(timeout.count())) <= 0) return true;
    char buffer[65536];
    const ssize_t got = ::recv(fd_, buffer, sizeof buffer, 0);
    if (got <= 0) return false;
    received.append(buffer, static_cast<size_t>(got));
    return true;
  }
  // Everything until the server closes the connection or `timeout` passes.
  std::string receive_all(std::chrono::milliseconds timeout, bool* closed = nullptr) {
    std::string received;
    const auto until = std::chrono::steady_clock::now() + timeout;
    bool open = true;
    while (open && std::chrono::steady_clock::now() < until) open = receive(received, std::chrono::milliseconds(50));
    if (closed) *closed = !open;
    return received;
  }

 private:
  int fd_;
  bool connected_ = false;
};

struct HttpReply {
  int status = 0;
  std::string headers;
  std::string body;  // de-chunked
};

// Splits a whole response (the connection closed after it) into status, headers and body.
inline HttpReply parse_reply(const std::string& raw) {
  HttpReply reply;
  const size_t end = raw.find("\r\n\r\n");
  if (raw.size() < 12 || end == std::string::npos) return reply;
  reply.status = std::stoi(raw.substr(9, 3));
  reply.headers = raw.substr(0, end);
  std::string rest = raw.substr(end + 4);
  if (reply.headers.find("chunked") == std::string::npos) {
    reply.body = rest;
    return reply;
  }
  for (size_t at = 0; at < rest.size();) {
    const size_t line = rest.find("\r\n", at);
    if (line == std::string::npos) break;
    const size_t size = std::stoul(rest.substr(at, line - at), nullptr, 16);
    if (size == 0) break;
    reply.body += rest.substr(line + 2, size);
    at = line + 2 + size + 2;
  }
  return reply;
}

inline std::string request_text(const std::string& method, const std::string& path, const std::string& body,
                                const std::string& api_key) {
  std::string text = method + " " + path + " HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n";
  if (!api_key.empty()) text += "Authorization: Bearer " + api_key + "\r\n";
  if (method == "POST") text += "Content-Type: application/json\r\nContent-Length: " + std::to_string(body.size()) + "\r\n";
  return text + "\r\n" + body;
}

// One request on a fresh connection, answered within `timeout`.
inline HttpReply http_request(int port, const std::string& method, const std::string& path, const std::string& body = "",
                              const std::string& api_key = "",
                              std::chrono::milliseconds timeout = std::chrono::seconds(60)) {
  Connection connection(port);
  if (!connection.connected() || !connection.send(request_text(method, path, body, api_key))) return {};
  return parse_reply(connection.receive_all(timeout));
}

}  // namespace paraflow::testing
