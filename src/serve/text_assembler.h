// A completion's text, from its tokens' bytes to pieces that are safe to send: stop strings are
// found across token boundaries and cut off; text that could still become a stop string is held
// back, and so is a character whose bytes have not all come; ill-formed bytes become U+FFFD. So
// every piece is valid UTF-8 and nothing sent ever has to be taken back.
#pragma once

#include <string>
#include <string_view>
#include <vector>

namespace paraflow::serve {

class TextAssembler {
 public:
  explicit TextAssembler(std::vector<std::string> stops);  // none empty

  // Adds a token's bytes; returns the text that is now safe to send (maybe empty). When a stop
  // string appears it returns the text before it and stopped() turns true: the completion is over.
  std::string add(std::string_view bytes);
  // The completion ended otherwise: the text held back, with an unfinished character as U+FFFD.
  std::string finish();
  bool stopped() const { return stopped_; }

 private:
  size_t stop_prefix_at_end() const;  // bytes at the end of pending_ that begin some stop string

  std::vector<std::string> stops_;
  std::string pending_;  // bytes received but not sent
  bool stopped_ = false;
};

}  // namespace paraflow::serve
