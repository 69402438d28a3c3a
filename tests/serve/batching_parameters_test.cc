// TF Serving's batching_parameters.txt: the article's settings and every field parse, fields left
// out take TF Serving's defaults, and bad files or values are refused naming the file, the place
// or the field.
#include <gtest/gtest.h>

#include <cstdio>

#include "base/error.h"
#include "base/file_io.h"
#include "reference_runner.h"
#include "serve/batching_parameters.h"

namespace paraflow {
namespace {

class BatchingParametersTest : public ::testing::Test {
 protected:
  std::string write(const std::string& text) {
    const std::string path = (dir.path() / "batching_parameters.txt").string();
    write_file_atomic(path, text);
    return path;
  }

  // The InputError message of reading `text` (the test fails when it reads fine).
  std::string error_of(const std::string& text) {
    try {
      serve::read_batching_parameters(write(text));
    } catch (const InputError& error) {
      return error.what();
    }
    ADD_FAILURE() << "read without error: " << text;
    return "";
  }

  testing::TempDir dir;
};

// `nproc`: the CPUs this process may run on, as TF's port::MaxParallelism() counts them.
int64_t nproc() {
  FILE* pipe = popen("nproc", "r");
  EXPECT_NE(pipe, nullptr);
  long long cpus = 0;
  EXPECT_EQ(std::fscanf(pipe, "%lld", &cpus), 1);
  pclose(pipe);
  return cpus;
}

TEST_F(BatchingParametersTest, TheArticlesSettingsParseWithTfServingsDefaultsForTheRest) {
  const serve::BatchingOptions options = serve::read_batching_parameters(
      write("max_batch_size { value: 32 }\nbatch_timeout_micros { value: 100000 }\nnum_batch_threads { value: 4 }\n"));
  EXPECT_EQ(options.max_batch_size, 32);
  EXPECT_EQ(options.batch_timeout_micros, 100000);
  EXPECT_EQ(options.num_batch_threads, 4);
  EXPECT_EQ(options.max_enqueued_batches, 10);
  EXPECT_EQ(options.thread_pool_name, "batch_threads");
  EXPECT_TRUE(options.allowed_batch_sizes.empty());
  EXPECT_FALSE(options.pad_variable_length_inputs);
}

TEST_F(BatchingParametersTest, AnEmptyFileHasTfServingsDefaults) {
  const serve::BatchingOptions options = serve::read_batching_parameters(write(""));
  EXPECT_EQ(options.max_batch_size, 1000);
  EXPECT_EQ(options.batch_timeout_micros, 0);
  EXPECT_EQ(options.max_enqueued_batches, 10);
  EXPECT_EQ(options.num_batch_threads, nproc());
  EXPECT_EQ(options.thread_pool_name, "batch_threads");
  EXPECT_TRUE(options.allowed_batch_sizes.empty());
  EXPECT_FALSE(options.pad_variable_length_inputs);
}

TEST_F(BatchingParametersTest, EveryFieldParses) {
  const serve::BatchingOptions options = serve::read_batching_parameters(write(R"(
    max_batch_size { value: 64 }
    batch_timeout_micros { value: 2500 }
    max_enqueued_batches { value: 3 }
    num_batch_threads { value: 2 }
    thread_pool_name { value: "predict_batches" }
    allowed_batch_sizes: [8, 16, 64]
    pad_variable_length_inputs: true
    enable_large_batch_splitting { value: false }
    max_execution_batch_size { value: 16 }
  )"));
  EXPECT_EQ(options.max_batch_size, 64);
  EXPECT_EQ(options.batch_timeout_micros, 2500);
  EXPECT_EQ(options.max_enqueued_batches, 3);
  EXPECT_EQ(options.num_batch_threads, 2);
  EXPECT_EQ(options.thread_pool_name, "predict_batches");
  EXPECT_EQ(options.allowed_batch_sizes, (std::vector<int64_t>{8, 16, 64}));
  EXPECT_TRUE(options.pad_variable_length_inputs);
  // Repeated fields may also come one entry at a time, as TF Serving's examples write them.
  EXPECT_EQ(serve::read_batching_parameters(write("max_batch_size { value: 4 } allowed_batch_sizes: 2 "
                                                  "allowed_batch_sizes: 4"))
                .allowed_batch_sizes,
            (std::vector<int64_t>{2, 4}));
}

TEST_F(BatchingParametersTest, AMalformedFileIsRefusedNamingTheFileLineAndColumn) {
  const std::string path = (dir.path() / "batching_parameters.txt").string();
  std::string message = error_of("max_batch_size { value: 32 }\nbatch_timeout_micros { value: soon }\n");
  EXPECT_NE(message.find(path + ":2:31: "), std::string::npos) << message;
  EXPECT_NE(message.find("soon"), std::string::npos) << message;
  // An unknown field: protobuf places the error just after the name, on its line.
  message = error_of("max_batch_size { value: 32 }\n  max_batch_sise { value: 32 }\n");
  EXPECT_NE(message.find(path + ":2:"), std::string::npos) << message;
  EXPECT_NE(message.find("max_batch_sise"), std::string::npos) << message;
}

TEST_F(BatchingParametersTest, ValuesOutOfRangeAreRefusedNamingTheField) {
  const std::string path = (dir.path() / "batching_parameters.txt").string();
  const std::vector<std::pair<std::string, std::string>> cases = {
      {"max_batch_size { value: 0 }", "max_batch_size: must be positive (got 0)"},
      {"batch_timeout_micros { value: -1 }", "batch_timeout_micros: must be non-negative (got -1)"},
      // Past these, the batch-size histogram's buckets and the deadlines overflowed (a hang at start).
      {"max_batch_size { value: 9223372036854775807 }",
       "max_batch_size: must be at most 1073741824 (got 9223372036854775807)"},
      {"batch_timeout_micros { value: 9223372036854775807 }", "batch_timeout_micros: must be at most 3600000000"},
      {"max_enqueued_batches { value: 0 }", "max_enqueued_batches: must be positive (got 0)"},
      {"num_batch_threads { value: 0 }", "num_batch_threads: must be positive (got 0)"},
      {"max_batch_size { value: 32 } allowed_batch_sizes: [8, 4, 32]",
       "allowed_batch_sizes: entries must be increasing (4 follows 8)"},
      {"max_batch_size { value: 32 } allowed_batch_sizes: [8, 8, 32]",
       "allowed_batch_sizes: entries must be increasing (8 follows 8)"},
      {"max_batch_size { value: 32 } allowed_batch_sizes: [0, 32]",
       "allowed_batch_sizes: entries must be positive (the first is 0)"},
      {"max_batch_size { value: 32 } allowed_batch_sizes: [8, 16]",
       "allowed_batch_sizes: the last entry must equal max_batch_size; it is 16, max_batch_size is 32"},
      // Unset, max_batch_size is TF Serving's default.
      {"allowed_batch_sizes: [8, 16]",
       "allowed_batch_sizes: the last entry must equal max_batch_size; it is 16, max_batch_size is 1000"},
      {"enable_large_batch_splitting { value: true }", "enable_large_batch_splitting: not supported"},
  };
  for (const auto& [text, expected] : cases) {
    const std::string message = error_of(text);
    EXPECT_EQ(message.rfind(path + ": ", 0), 0u) << message;
    EXPECT_NE(message.find(expected), std::string::npos) << text << " -> " << message;
  }
  EXPECT_EQ(serve::read_batching_parameters(write("allowed_batch_sizes: [8, 1000]")).max_batch_size, 1000);
}

TEST_F(BatchingParametersTest, AMissingFileIsAnIoErrorNamingIt) {
  const std::string path = (dir.path() / "missing.txt").string();
  try {
    serve::read_batching_parameters(path);
    ADD_FAILURE() << "read a missing file";
  } catch (const IoError& error) {
    EXPECT_NE(std::string(error.what()).find(path), std::string::npos) << error.what();
  }
}

}  // namespace
}  // namespace paraflow
