// The API key check: `Authorization: Bearer <key>`, compared in constant time.
#pragma once

#include <string_view>

namespace paraflow::serve {

bool bearer_token_matches(std::string_view authorization, std::string_view api_key);

}  // namespace paraflow::serve
