// The KV block pool's prefix hash: SipHash-2-4 against the reference vectors of its paper, keyed
// per pool (so a prompt cannot be crafted offline to collide with another's blocks), and the
// cache handing a block out only for the same tokens after the same prefix.
#include <gtest/gtest.h>

#include <numeric>

#include "infer/kv_blocks.h"

namespace paraflow {
namespace {

// Aumasson and Bernstein, "SipHash: a fast short-input PRF", appendix A: key 00 01 ... 0f.
TEST(KvBlocks, SipHashMatchesTheReferenceVectors) {
  const std::array<uint64_t, 2> key{0x0706050403020100ull, 0x0f0e0d0c0b0a0908ull};
  std::array<uint8_t, 15> message{};
  std::iota(message.begin(), message.end(), uint8_t{0});
  EXPECT_EQ(infer::siphash24(key, message.data(), 15), 0xa129ca6149be45e5ull);  // the paper's worked example
  EXPECT_EQ(infer::siphash24(key, message.data(), 0), 0x726fdb47dd0e0e31ull);   // vectors.h, empty input
  EXPECT_EQ(infer::siphash24(key, message.data(), 8), 0x93f5f5799a932462ull);   // vectors.h, 8 bytes
}

TEST(KvBlocks, ChainHashesAreKeyedPerPoolAndNameTheirPrefix) {
  infer::KvBlockPool pool(4, 2), other(4, 2);
  const int32_t tokens[] = {7, 300};
  const uint64_t first = pool.chain_hash(0, tokens, 2);
  EXPECT_EQ(first, pool.chain_hash(0, tokens, 2));
  EXPECT_NE(first, other.chain_hash(0, tokens, 2));  // another key (fails once in 2^64 runs)
  EXPECT_NE(pool.chain_hash(first, tokens, 2), pool.chain_hash(first + 1, tokens, 2));

  const int32_t block = *pool.allocate();
  pool.publish(block, first, tokens);
  pool.release(block);
  EXPECT_TRUE(pool.cached(block));
  const int32_t different[] = {7, 301};
  EXPECT_FALSE(pool.lookup(first, different).has_value());  // same hash, other tokens: a miss
  EXPECT_EQ(pool.lookup(first, tokens), block);
  EXPECT_EQ(pool.ref_count(block), 1);
}

}  // namespace
}  // namespace paraflow
