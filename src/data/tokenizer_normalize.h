// Unicode normalization form C, which Qwen2's tokenizer applies before pre-tokenisation.
#pragma once

#include <string>
#include <string_view>

namespace paraflow::data {

// Writes NFC(text) to `out` and returns true, or returns false when text is NFC already (out
// untouched). Bytes that are not well-formed UTF-8 are kept as they are.
bool to_nfc(std::string_view text, std::string& out);

}  // namespace paraflow::data
