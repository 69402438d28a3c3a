// OpenAI's error object, {"error": {"message", "type", "param", "code"}}, with its HTTP status.
// Everything the API refuses is an ApiError; the service turns it into the response.
#pragma once

#include <string>
#include <utility>
#include <vector>

#include "base/error.h"

namespace paraflow::serve {

class ApiError : public Error {
 public:
  // An empty `param` or `code` is written as null.
  ApiError(int status, std::string type, const std::string& message, std::string param = "", std::string code = "")
      : Error(message), status_(status), type_(std::move(type)), param_(std::move(param)), code_(std::move(code)) {}
  int status() const { return status_; }
  std::string body() const;  // the JSON text of the error object
  // Headers the status asks for (Allow with a 405, WWW-Authenticate with a 401).
  ApiError&& with_header(std::string name, std::string value) && {
    headers_.emplace_back(std::move(name), std::move(value));
    return std::move(*this);
  }
  const std::vector<std::pair<std::string, std::string>>& headers() const { return headers_; }

 private:
  std::vector<std::pair<std::string, std::string>> headers_;
  int status_;
  std::string type_;
  std::string param_;
  std::string code_;
};

// 400 invalid_request_error naming the request field at fault (`param`).
template <typename... Args>
[[noreturn]] void refuse(const std::string& param, fmt::format_string<Args...> format, Args&&... args) {
  throw ApiError(400, "invalid_request_error", fmt::format(format, std::forward<Args>(args)...), param);
}

}  // namespace paraflow::serve
