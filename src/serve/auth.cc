#include "serve/auth.h"

#include <strings.h>

namespace paraflow::serve {

bool bearer_token_matches(std::string_view authorization, std::string_view api_key) {
  constexpr std::string_view scheme = "Bearer ";
  if (authorization.size() < scheme.size() ||
      strncasecmp(authorization.data(), scheme.data(), scheme.size()) != 0) {  // the scheme is case-insensitive
    return false;
  }
  const std::string_view token = authorization.substr(scheme.size());
  // Time that depends only on the key's length: a wrong key's answer tells nothing of where it differs.
  unsigned char difference = token.size() == api_key.size() ? 0 : 1;
  for (size_t i = 0; i < api_key.size(); ++i) {
    difference |= static_cast<unsigned char>(api_key[i] ^ (i < token.size() ? token[i] : 0));
  }
  return difference == 0 && !api_key.empty();
}

}  // namespace paraflow::serve
