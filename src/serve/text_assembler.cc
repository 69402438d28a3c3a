#include "serve/text_assembler.h"

#include <algorithm>

#include "serve/utf8.h"

namespace paraflow::serve {

TextAssembler::TextAssembler(std::vector<std::string> stops) : stops_(std::move(stops)) {}

std::string TextAssembler::add(std::string_view bytes) {
  pending_.append(bytes);
  // Text already sent never ends with the start of a stop string, so a match lies in pending_.
  size_t stop = std::string::npos;
  for (const std::string& text : stops_) stop = std::min(stop, pending_.find(text));
  if (stop != std::string::npos) {
    stopped_ = true;
    std::string before = to_valid_utf8(std::string_view(pending_).substr(0, stop));
    pending_.clear();
    return before;
  }
  const size_t ready = complete_utf8_prefix(std::string_view(pending_).substr(0, pending_.size() - stop_prefix_at_end()));
  std::string piece = to_valid_utf8(std::string_view(pending_).substr(0, ready));
  pending_.erase(0, ready);
  return piece;
}

std::string TextAssembler::finish() {
  std::string rest = to_valid_utf8(pending_);
  pending_.clear();
  return rest;
}

size_t TextAssembler::stop_prefix_at_end() const {
  size_t longest = 0;
  for (const std::string& stop : stops_) {
    for (size_t length = std::min(stop.size() - 1, pending_.size()); length > longest; --length) {
      if (std::string_view(pending_).ends_with(std::string_view(stop).substr(0, length))) {
        longest = length;
        break;
      }
    }
  }
  return longest;
}

}  // namespace paraflow::serve
