// libFuzzer target for the JSON request decoders: any body must decode or be refused with a 400
// ApiError whose error object is valid JSON; nothing else may escape, crash or read out of bounds.
//   scripts/fuzz.sh openai_request 60      # 60 seconds
#include <cstddef>
#include <cstdint>
#include <nlohmann/json.hpp>
#include <string_view>

#include "serve/api_error.h"
#include "serve/openai_request.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string_view body(reinterpret_cast<const char*>(data), size);
  for (bool chat : {false, true}) {
    try {
      if (chat) {
        paraflow::serve::chat_prompt(paraflow::serve::decode_chat_request(body).messages);
      } else {
        paraflow::serve::decode_completion_request(body);
      }
    } catch (const paraflow::serve::ApiError& error) {
      if (error.status() != 400) __builtin_trap();
      (void)nlohmann::json::parse(error.body());  // throws (a crash here) if the error is not JSON
    }
  }
  return 0;
}
