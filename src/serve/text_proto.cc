#include "serve/text_proto.h"

#include <fmt/format.h>
#include <google/protobuf/io/tokenizer.h>
#include <google/protobuf/text_format.h>

#include "base/error.h"

namespace paraflow::serve {

namespace {

// Keeps the parser's first error with its place (the parser counts lines and columns from 0).
class FirstError : public google::protobuf::io::ErrorCollector {
 public:
  void AddError(int line, google::protobuf::io::ColumnNumber column, const std::string& message) override {
    if (message_.empty()) message_ = fmt::format("{}:{}: {}", line + 1, column + 1, message);
  }
  const std::string& message() const { return message_; }

 private:
  std::string message_;
};

}  // namespace

void parse_text_proto(const std::string& text, google::protobuf::Message& message, const std::string& source) {
  FirstError errors;
  google::protobuf::TextFormat::Parser parser;
  parser.RecordErrorsTo(&errors);
  if (!parser.ParseFromString(text, &message)) {
    throw InputError(fmt::format("{}:{}", source,
                                 errors.message().empty() ? fmt::format(" not a {} message", message.GetTypeName())
                                                          : errors.message()));
  }
}

}  // namespace paraflow::serve
