// libFuzzer target for the safetensors reader: any byte string must parse or be refused with
// paraflow::InputError, never crash or read out of bounds (build with ASan).
//   scripts/fuzz.sh safetensors 60      # 60 seconds
#include <cstddef>
#include <cstdint>
#include <string>

#include "base/error.h"
#include "model/safetensors.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  try {
    paraflow::model::SafetensorsFile file =
        paraflow::model::SafetensorsFile::parse(std::string(reinterpret_cast<const char*>(data), size), "fuzz");
    for (const auto& [name, entry] : file.entries()) file.tensor(name);
  } catch (const paraflow::InputError&) {
  }
  return 0;
}
