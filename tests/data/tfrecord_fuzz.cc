// libFuzzer target: the TFRecord reader (both policies, all compressions) and the Example fast
// path on whatever it returns. Only paraflow::InputError may escape the code under test.
//   cmake -S . -B build-fuzz -DCMAKE_CXX_COMPILER=clang++ -DPARAFLOW_FUZZ=ON && make -C build-fuzz tfrecord_fuzz
//   build-fuzz/tests/data/tfrecord_fuzz -max_total_time=60
#include <cstdint>
#include <string>

#include "base/error.h"
#include "data/example.h"
#include "data/tfrecord.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace paraflow::data;
  if (size == 0) return 0;
  // The first byte picks the compression; the rest is the file.
  const Compression compression = static_cast<Compression>(data[0] % 3);
  const std::string bytes(reinterpret_cast<const char*>(data + 1), size - 1);
  for (ErrorPolicy policy : {ErrorPolicy::skip, ErrorPolicy::fail}) {
    TFRecordReaderOptions options;
    options.compression = compression;
    options.policy = policy;
    options.buffer_size = 64;  // small, so records straddle refills
    options.log = [](const std::string&) {};
    try {
      TFRecordReader reader(memory_input(bytes, compression, "fuzz"), options);
      std::vector<int64_t> ids;
      while (auto record = reader.next()) {
        try {
          decode_int64_feature(*record, "input_ids", ids);
        } catch (const paraflow::InputError&) {
        }
      }
      if (policy == ErrorPolicy::skip && reader.stats().records > 0) {
        reader.seek(0);  // rereading from the start finds the same first record
        reader.next();
      }
    } catch (const paraflow::InputError&) {
      if (policy == ErrorPolicy::skip) __builtin_trap();  // skip must not throw InputError
    }
  }
  return 0;
}
