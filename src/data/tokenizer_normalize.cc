#include "data/tokenizer_normalize.h"

#include "base/error.h"

namespace paraflow::data {

bool to_nfc(std::string_view text, std::string& out) {
  // Code points below U+0300 (lead bytes below 0xCC) are NFC whatever surrounds them.
  for (char c : text) {
    check(static_cast<unsigned char>(c) < 0xCC, "tokenizer: NFC normalization of text beyond U+0300 is not implemented");
  }
  (void)out;
  return false;
}

}  // namespace paraflow::data
