// Stop strings across token boundaries, the text held back, UTF-8 split between tokens.
#include <gtest/gtest.h>

#include "serve/text_assembler.h"
#include "serve/utf8.h"

namespace paraflow::serve {
namespace {

// Feeds `tokens` one by one; returns the pieces given out, with the finish() rest unless stopped.
std::vector<std::string> pieces(TextAssembler& text, const std::vector<std::string>& tokens) {
  std::vector<std::string> out;
  for (const std::string& token : tokens) {
    out.push_back(text.add(token));
    if (text.stopped()) return out;
  }
  out.push_back(text.finish());
  return out;
}

TEST(Utf8, CompletePrefixHoldsBackAnUnfinishedCharacter) {
  EXPECT_EQ(complete_utf8_prefix("abc"), 3u);
  EXPECT_EQ(complete_utf8_prefix("ab\xE2\x82"), 2u);       // € = E2 82 AC, two bytes of three
  EXPECT_EQ(complete_utf8_prefix("ab\xE2\x82\xAC"), 5u);
  EXPECT_EQ(complete_utf8_prefix("\xF0\x9F\x98"), 0u);      // 😀 = F0 9F 98 80
  EXPECT_EQ(complete_utf8_prefix("a\xFF"), 2u);             // never a lead: finished (ill-formed)
  EXPECT_EQ(complete_utf8_prefix("a\xE2\x28"), 3u);         // ill-formed already: nothing to wait for
  EXPECT_EQ(complete_utf8_prefix("a\xED\xA0"), 3u);         // a surrogate's start: ill-formed
}

TEST(Utf8, IllFormedBytesBecomeReplacementCharacters) {
  EXPECT_EQ(to_valid_utf8("caf\xC3\xA9"), "caf\xC3\xA9");
  EXPECT_EQ(to_valid_utf8("a\xFF" "b"), "a\xEF\xBF\xBD" "b");
  EXPECT_EQ(to_valid_utf8("\xE2\x82" "b"), "\xEF\xBF\xBD" "b");  // one U+FFFD for the maximal subpart
  EXPECT_EQ(to_valid_utf8("\xC0\x80"), "\xEF\xBF\xBD\xEF\xBF\xBD");  // overlong: each byte
  EXPECT_EQ(to_valid_utf8("\xF4\x90\x80\x80").substr(0, 3), "\xEF\xBF\xBD");  // beyond U+10FFFF
  EXPECT_EQ(utf8_length("a\xC3\xA9\xE2\x82\xAC\xFF"), 4u);
}

TEST(TextAssembler, StopStringAcrossTokensIsCutAndNeverSent) {
  TextAssembler text({"STOP"});
  EXPECT_EQ(pieces(text, {"hello S", "T", "OP and more"}), (std::vector<std::string>{"hello ", "", ""}));
  EXPECT_TRUE(text.stopped());
}

TEST(TextAssembler, TextThatCouldBecomeAStopIsHeldThenReleased) {
  TextAssembler text({"STOP"});
  EXPECT_EQ(pieces(text, {"a S", "T", "x", "ST"}), (std::vector<std::string>{"a ", "", "STx", "", "ST"}));
  EXPECT_FALSE(text.stopped());
}

TEST(TextAssembler, EarliestOfSeveralStopsAndOverlappingPrefixes) {
  TextAssembler text({"abab", "b!"});
  // "ab" may become "abab": held; then "b!" appears, before any "abab".
  EXPECT_EQ(pieces(text, {"x", "ab", "!"}), (std::vector<std::string>{"x", "", "a"}));
  TextAssembler overlapping({"aab"});
  EXPECT_EQ(pieces(overlapping, {"a", "a", "a", "b"}), (std::vector<std::string>{"", "", "a", ""}));
  EXPECT_TRUE(overlapping.stopped());
}

TEST(TextAssembler, SplitCharactersWaitForTheirLastByte) {
  TextAssembler text({});
  // "€" split over three tokens, then "😀" over two; every piece is whole characters.
  EXPECT_EQ(pieces(text, {"a\xE2", "\x82", "\xAC" "b\xF0\x9F", "\x98\x80"}),
            (std::vector<std::string>{"a", "", "\xE2\x82\xAC" "b", "\xF0\x9F\x98\x80", ""}));
}

TEST(TextAssembler, AnUnfinishedCharacterAtTheEndIsReplaced) {
  TextAssembler text({});
  EXPECT_EQ(pieces(text, {"ok\xE2\x82"}), (std::vector<std::string>{"ok", "\xEF\xBF\xBD"}));
  TextAssembler ill({});
  EXPECT_EQ(pieces(ill, {"\xFF" "a"}), (std::vector<std::string>{"\xEF\xBF\xBD" "a", ""}));
}

TEST(TextAssembler, StopStringAfterASplitCharacter) {
  TextAssembler text({"\xC3\xA9!"});  // "é!"
  EXPECT_EQ(pieces(text, {"caf\xC3", "\xA9", "!"}), (std::vector<std::string>{"caf", "", ""}));
  EXPECT_TRUE(text.stopped());
}

}  // namespace
}  // namespace paraflow::serve
