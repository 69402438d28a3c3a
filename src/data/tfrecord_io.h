// Byte streams under TFRecord files: plain files, memory, and zlib/gzip (de)compression, read and
// written in bounded chunks so a file of any size streams through a fixed amount of memory.
// Positions are always offsets in the uncompressed stream, which is what TFRecord offsets mean.
#pragma once

#include <cstdint>
#include <filesystem>
#include <memory>
#include <optional>
#include <string>
#include <string_view>

namespace paraflow::data {

// TensorFlow's compression_type: "" / "NONE", "GZIP" (RFC 1952), "ZLIB" (RFC 1950).
enum class Compression { none, gzip, zlib };

// Accepts TensorFlow's spellings, case-insensitively; throws InputError otherwise.
Compression parse_compression(std::string_view name);
std::string_view compression_name(Compression compression);  // "NONE", "GZIP", "ZLIB"

class InputStream {
 public:
  virtual ~InputStream() = default;
  // Reads up to `size` bytes; fewer only at the end of the stream. Throws on corrupt compression.
  virtual size_t read(char* dst, size_t size) = 0;
  // Moves to an uncompressed offset. Compressed streams cannot jump: moving backwards restarts
  // decompression at the file's beginning, and moving forwards decompresses and discards.
  virtual void seek(uint64_t offset) = 0;
  virtual uint64_t position() const = 0;
  // The stream's total size when known without reading it (uncompressed sources only).
  virtual std::optional<uint64_t> size() const = 0;
  // The name that error messages use (the file path).
  virtual const std::string& name() const = 0;
};

std::unique_ptr<InputStream> open_input(const std::filesystem::path& path, Compression compression);
// A stream over bytes held in memory (tests, fuzzing); `data` holds the compressed form if any.
std::unique_ptr<InputStream> memory_input(std::string data, Compression compression,
                                          std::string name = "<memory>");

class OutputStream {
 public:
  virtual ~OutputStream() = default;
  virtual void write(const char* data, size_t size) = 0;
  // Hands everything written so far to the operating system (a complete zlib block when
  // compressing), so readers of the file see it; `durable` also fsyncs.
  virtual void flush(bool durable = false) = 0;
  // Finishes the compressed stream, fsyncs and closes. Further writes are errors.
  virtual void close() = 0;
  virtual uint64_t position() const = 0;  // uncompressed bytes written
};

// Creates (truncates) `path`. `level` is zlib's 0..9, or -1 for its default.
std::unique_ptr<OutputStream> open_output(const std::filesystem::path& path, Compression compression,
                                          int level = -1);

}  // namespace paraflow::data
