// GGUF files read against llama.cpp's gguf-py (tests/reference/gguf_files.py in .venv-data,
// scripts/setup_python_data.sh): a file its GGUFWriter wrote, with metadata of every value type and
// tensors in F32, F16, BF16, Q8_0 and Q4_K, reads as the values it was given; then broken files
// (truncated anywhere, a tensor type we do not read, an offset past the end, random corruption)
// are refused with an InputError naming the tensor or field and the byte, and nothing crashes.
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>

#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <string>
#include <vector>

#include "base/error.h"
#include "base/file_io.h"
#include "base/random.h"
#include "model/gguf.h"
#include "reference_runner.h"
#include "tensor/quantized.h"
#include "test_util.h"

namespace paraflow::model {
namespace {

namespace fs = std::filesystem;

class GgufTest : public ::testing::Test {
 protected:
  void SetUp() override {
    const fs::path root = testing::source_dir(), python = root / ".venv-data/bin/python";
    ASSERT_TRUE(fs::exists(python)) << python << " missing: run scripts/setup_python_data.sh";
    const std::string command =
        python.string() + " " + (root / "tests/reference/gguf_files.py").string() + " write " + dir.path().string();
    ASSERT_EQ(std::system(command.c_str()), 0) << command;
    expected = nlohmann::json::parse(read_file(dir.path() / "expected.json"));
    bytes = read_file(dir.path() / "written.gguf");
  }

  // `bytes` changed by `change`, written as a file of its own, then opened: the error's message,
  // or "" when it opened.
  std::string open_changed(const std::string& changed) {
    const fs::path path = dir.path() / "changed.gguf";
    write_file_atomic(path, changed);
    try {
      GgufFile::open(path);
    } catch (const InputError& error) {
      return error.what();
    }
    return "";
  }

  // Where tensor `name`'s info puts its ggml type and its offset: after the name, rank and dims.
  size_t type_field(const std::string& name) {
    const size_t at = bytes.find(name);
    EXPECT_NE(at, std::string::npos);
    uint32_t rank;
    std::memcpy(&rank, bytes.data() + at + name.size(), 4);
    return at + name.size() + 4 + 8 * rank;
  }

  testing::TempDir dir;
  nlohmann::json expected;
  std::string bytes;
};

TEST_F(GgufTest, ReadsWhatGgufWriterWrote) {
  const GgufFile file = GgufFile::open(dir.path() / "written.gguf");
  EXPECT_EQ(file.version(), 3u);
  EXPECT_EQ(file.alignment(), expected["alignment"].get<uint64_t>());
  EXPECT_EQ(file.value("general.architecture").as_string("general.architecture"), "gpt2");
  for (const auto& [key, record] : expected["metadata"].items()) {
    SCOPED_TRACE(key);
    const GgufValue& value = file.value(key);
    const std::string type = record["type"];
    ASSERT_EQ(gguf_type_name(value.type), type == "bool" ? std::string("bool") : type);
    if (type == "array") {
      ASSERT_EQ(gguf_type_name(value.element_type), record["element"].get<std::string>());
      const auto& elements = value.elements;
      ASSERT_EQ(elements.size(), record["value"].size());
      for (size_t i = 0; i < elements.size(); ++i) {
        if (value.element_type == GgufType::string) EXPECT_EQ(elements[i].as_string(key), record["value"][i].get<std::string>());
        else EXPECT_EQ(elements[i].as_int(key), record["value"][i].get<int64_t>());
      }
    } else if (type == "string") {
      EXPECT_EQ(value.as_string(key), record["value"].get<std::string>());
    } else if (type == "float32" || type == "float64") {
      EXPECT_EQ(value.as_float(key), record["value"].get<double>());
    } else if (type == "bool") {
      EXPECT_EQ(value.unsigned_value, record["value"].get<bool>() ? 1u : 0u);
    } else if (type == "uint64") {
      EXPECT_EQ(value.unsigned_value, record["value"].get<uint64_t>());
    } else {
      EXPECT_EQ(value.as_int(key), record["value"].get<int64_t>());
    }
  }
  ASSERT_EQ(file.tensors().size(), expected["tensors"].size());
  for (const auto& [name, record] : expected["tensors"].items()) {
    SCOPED_TRACE(name);
    const Tensor tensor = file.tensor(name);
    EXPECT_EQ(tensor.shape().dims(), record["shape"].get<std::vector<int64_t>>());
    std::vector<float> values(static_cast<size_t>(tensor.numel()));
    switch (tensor.dtype()) {
      case DType::f32: std::memcpy(values.data(), tensor.raw(), tensor.nbytes()); break;
      case DType::f16:
      case DType::bf16:
        for (size_t i = 0; i < values.size(); ++i) {
          const uint16_t bits = static_cast<const uint16_t*>(tensor.raw())[i];
          values[i] = tensor.dtype() == DType::f16 ? f16_to_f32(bits) : bf16_to_f32(bits);
        }
        break;
      case DType::q8_0:
      case DType::q4_k:
      case DType::q5_0: {
        std::string hex;
        for (size_t i = 0; i < tensor.nbytes(); ++i) hex += fmt::format("{:02x}", static_cast<const uint8_t*>(tensor.raw())[i]);
        EXPECT_EQ(hex, record["bytes"].get<std::string>());
        dequantize_blocks(tensor.dtype(), tensor.raw(), values.data(), tensor.numel());
        break;
      }
      default: FAIL() << "unexpected dtype " << dtype_name(tensor.dtype());
    }
    const std::string type = record["type"];
    const char* read_as = tensor.dtype() == DType::q8_0   ? "Q8_0"
                          : tensor.dtype() == DType::q4_k ? "Q4_K"
                          : tensor.dtype() == DType::q5_0 ? "Q5_0"
                          : tensor.dtype() == DType::f16  ? "F16"
                          : tensor.dtype() == DType::bf16 ? "BF16"
                                                          : "F32";
    EXPECT_EQ(type, read_as);
    EXPECT_EQ(values, record["values"].get<std::vector<float>>());
  }
}

TEST_F(GgufTest, RefusesTruncatedFilesAtEveryLengthNamingTheByte) {
  const GgufFile file = GgufFile::open(dir.path() / "written.gguf");
  for (size_t length = 0; length < bytes.size(); ++length) {
    const std::string message = open_changed(bytes.substr(0, length));
    // Every prefix that cuts into a tensor's bytes or the header fails, naming a byte; only the
    // alignment padding after the last tensor may go.
    if (message.empty()) {
      EXPECT_GE(length, bytes.size() - file.alignment()) << "a prefix of " << length << " bytes opened";
    } else {
      EXPECT_NE(message.find("byte"), std::string::npos) << message;
    }
  }
}

TEST_F(GgufTest, RefusesATensorTypeItDoesNotReadNamingTheTensorAndType) {
  std::string changed = bytes;
  const uint32_t q5_k = 13;
  std::memcpy(changed.data() + type_field("matrix.q8_0"), &q5_k, 4);
  const std::string message = open_changed(changed);
  EXPECT_NE(message.find("'matrix.q8_0'"), std::string::npos) << message;
  EXPECT_NE(message.find("Q5_K"), std::string::npos) << message;
  EXPECT_NE(message.find("byte"), std::string::npos) << message;
}

TEST_F(GgufTest, RefusesAnOffsetPastTheEndNamingTheTensor) {
  std::string changed = bytes;
  const uint64_t far = uint64_t{1} << 30;
  std::memcpy(changed.data() + type_field("matrix.f16") + 4, &far, 8);
  const std::string message = open_changed(changed);
  EXPECT_NE(message.find("'matrix.f16'"), std::string::npos) << message;
  EXPECT_NE(message.find("run past the end"), std::string::npos) << message;
}

TEST_F(GgufTest, RandomCorruptionIsRefusedOrReadNeverACrash) {
  Rng rng(testing::test_seed());
  int refused = 0;
  for (int trial = 0; trial < 3000; ++trial) {
    std::string changed = bytes;
    const int flips = 1 + static_cast<int>(rng.below(4));
    for (int f = 0; f < flips; ++f) {
      // Mostly the header (where the structure is), sometimes anywhere.
      const size_t limit = rng.below(4) == 0 ? changed.size() : 768;
      changed[rng.below(limit)] = static_cast<char>(rng.below(256));
    }
    const fs::path path = dir.path() / "changed.gguf";
    write_file_atomic(path, changed);
    try {
      const GgufFile file = GgufFile::open(path);
      for (const GgufTensorInfo& info : file.tensors()) file.tensor(info.name);  // every view in bounds
    } catch (const InputError&) {
      ++refused;
    } catch (const std::exception& error) {
      ADD_FAILURE() << "not an InputError: " << error.what();
    }
  }
  std::printf("  %d of 3000 corrupted files refused\n", refused);
  EXPECT_GT(refused, 0);
}

}  // namespace
}  // namespace paraflow::model
