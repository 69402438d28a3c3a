#include <gtest/gtest.h>

#include "serve/auth.h"

namespace paraflow::serve {
namespace {

TEST(Auth, BearerTokenMustMatchExactly) {
  EXPECT_TRUE(bearer_token_matches("Bearer s3cret", "s3cret"));
  EXPECT_TRUE(bearer_token_matches("bearer s3cret", "s3cret"));  // the scheme is case-insensitive
  EXPECT_FALSE(bearer_token_matches("Bearer s3cre", "s3cret"));
  EXPECT_FALSE(bearer_token_matches("Bearer s3cret2", "s3cret"));
  EXPECT_FALSE(bearer_token_matches("Bearer S3CRET", "s3cret"));
  EXPECT_FALSE(bearer_token_matches("Basic s3cret", "s3cret"));
  EXPECT_FALSE(bearer_token_matches("s3cret", "s3cret"));
  EXPECT_FALSE(bearer_token_matches("", "s3cret"));
  EXPECT_FALSE(bearer_token_matches("Bearer ", ""));  // no key configured matches nothing
}

}  // namespace
}  // namespace paraflow::serve
