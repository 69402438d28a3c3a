// libFuzzer target for the tokenizer: any bytes must split into pieces that cover them, encode
// (with and without special tokens) and decode back to themselves, and the fast BPE must agree
// with the reference one.
//   cmake -S . -B build-fuzz -DCMAKE_CXX_COMPILER=clang++ -DPARAFLOW_FUZZ=ON
//   make -C build-fuzz tokenizer_fuzz && build-fuzz/tests/data/tokenizer_fuzz -max_total_time=60
#include <cstdlib>
#include <string>

#include "data/tokenizer.h"
#include "data/tokenizer_pretokenize.h"
#include "data/tokenizer_train.h"

using namespace paraflow::data;

namespace {

const Tokenizer& tokenizer() {
  static const Tokenizer tok = [] {
    std::string text;
    for (int i = 0; i < 20; ++i) {
      text += "The quick brown fox's 12345 jumps!!  over\r\n\tthe lazy dog. 日本語 😀😀 e\xCC\x81 aaaa     ";
    }
    BpeTrainOptions options;
    options.vocab_size = 500;
    options.min_pair_count = 1;
    BpeTrainer trainer(options);
    trainer.add_text(text);
    return trainer.train();
  }();
  return tok;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  std::string_view text(reinterpret_cast<const char*>(data), size);
  std::string joined;
  gpt2_split(text, [&](std::string_view piece) {
    if (piece.empty()) std::abort();
    joined += piece;
  });
  if (joined != text) std::abort();
  const Tokenizer& tok = tokenizer();
  for (bool allow : {true, false}) {
    if (tok.decode(tok.encode(text, allow)) != text) std::abort();
  }
  std::string_view piece = text.substr(0, 300);
  if (tok.encode_piece(piece) != tok.encode_piece_reference(piece)) std::abort();
  return 0;
}
