// paraflow::Error is the one exception family of the project. Messages name the file, offset,
// field or parameter at fault; the CLI and the server catch it at their boundary.
#pragma once

#include <fmt/format.h>

#include <stdexcept>
#include <string>

namespace paraflow {

class Error : public std::runtime_error {
 public:
  explicit Error(const std::string& message) : std::runtime_error(message) {}
};

// Bad user input: a config value, a command-line flag, a file's content.
class InputError : public Error {
 public:
  using Error::Error;
};

// The operating system refused: open, read, write, rename failed.
class IoError : public Error {
 public:
  using Error::Error;
};

template <typename... Args>
[[noreturn]] void fail(fmt::format_string<Args...> format, Args&&... args) {
  throw InputError(fmt::format(format, std::forward<Args>(args)...));
}

// check(cond, "...") throws InputError with the formatted message when cond is false.
template <typename... Args>
void check(bool condition, fmt::format_string<Args...> format, Args&&... args) {
  if (!condition) throw InputError(fmt::format(format, std::forward<Args>(args)...));
}

}  // namespace paraflow
