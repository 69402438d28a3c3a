// UTF-8 as the API needs it: token bytes may end inside a character, and JSON text must be valid.
#pragma once

#include <cstddef>
#include <string>
#include <string_view>

namespace paraflow::serve {

// The longest prefix of `text` that does not end inside a character: a well-formed but unfinished
// sequence at the end is left out (its next bytes may still come).
size_t complete_utf8_prefix(std::string_view text);

// `text` with every ill-formed byte sequence replaced by U+FFFD (Unicode's "maximal subpart" rule).
std::string to_valid_utf8(std::string_view text);

// Characters (code points, U+FFFD counting one per ill-formed sequence) in `text`.
size_t utf8_length(std::string_view text);

}  // namespace paraflow::serve
