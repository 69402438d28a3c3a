// SentencePiece-style BPE (Llama 2, Mistral) as Hugging Face's BPE model runs it with
// byte_fallback: spaces are "▁"; a word starts as its characters' tokens; a character that is not
// a token becomes its UTF-8 bytes' `<0xNN>` tokens when the vocabulary has them all, else the unk
// token (a run of them fused into one when fuse_unk), else nothing. The merges then run as for
// byte-level BPE.
#include "data/tokenizer.h"
#include "data/tokenizer_pretokenize.h"

namespace paraflow::data {

// Spaces are "▁" in SentencePiece's vocabulary, held here as spaces: a "▁" typed in the text is
// one too. Then the leading space, as options().prepend_space says. Returns false when the text
// stays as it is.
bool Tokenizer::sentencepiece_spaces(std::string_view text, bool at_start, std::string& out) const {
  const PrependSpace scheme = options_.prepend_space;
  const bool prepend = scheme == PrependSpace::kAlways || scheme == PrependSpace::kAlwaysEvenAfterSpace ||
                       (scheme == PrependSpace::kFirst && at_start);
  if (!prepend && text.find(kMetaspace) == std::string_view::npos) return false;
  out = prepend ? " " : "";
  for (size_t i = 0; i < text.size();) {
    if (text.compare(i, kMetaspace.size(), kMetaspace) == 0) {
      out += ' ';
      i += kMetaspace.size();
    } else {
      out += text[i++];
    }
  }
  // Metaspace prepends only to a section that does not start with a space already.
  if (prepend && scheme != PrependSpace::kAlwaysEvenAfterSpace && out.size() > 1 && out[1] == ' ') out.erase(0, 1);
  return true;
}

void Tokenizer::sentencepiece_symbols(const unsigned char* bytes, size_t size, std::vector<TokenId>& parts) const {
  const unsigned char* end = bytes + size;
  // An unk not yet written: a following unknown character fuses into it (fuse_unk) or writes it.
  // Like Hugging Face's, it is written when a known character comes (not a byte fallback) or at
  // the end.
  bool pending_unk = false;
  for (const unsigned char* p = bytes; p < end;) {
    const size_t len = utf8_char_length(p, end);
    auto it = index_.find(std::string_view(reinterpret_cast<const char*>(p), len));
    if (it != index_.end()) {
      if (pending_unk) parts.push_back(options_.unk_id);
      pending_unk = false;
      parts.push_back(it->second);
      p += len;
      continue;
    }
    bool fallback = !options_.byte_fallback.empty();
    for (size_t i = 0; fallback && i < len; ++i) fallback = byte_token_[p[i]] >= 0;
    if (fallback) {
      for (size_t i = 0; i < len; ++i) parts.push_back(byte_token_[p[i]]);
    } else if (options_.unk_id >= 0) {
      if (pending_unk && !options_.fuse_unk) parts.push_back(options_.unk_id);
      pending_unk = true;
    }
    p += len;
  }
  if (pending_unk) parts.push_back(options_.unk_id);
}

}  // namespace paraflow::data
