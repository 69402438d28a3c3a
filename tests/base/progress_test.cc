// The progress line's time left: the rate of this session's own steps, so a run resumed near its
// end does not divide its time by the steps done before it started.
#include "base/progress.h"

#include <gtest/gtest.h>

namespace paraflow {
namespace {

TEST(Progress, TimeLeftCountsOnlyThisSessionsSteps) {
  EXPECT_DOUBLE_EQ(remaining_seconds(10.0, 0, 10, 100), 90.0);    // 1 s per step, 90 to go
  EXPECT_DOUBLE_EQ(remaining_seconds(10.0, 90, 95, 100), 10.0);   // resumed at 90: 2 s per step, 5 to go
  EXPECT_DOUBLE_EQ(remaining_seconds(3.0, 9000, 9000, 10000), 0.0);  // no step of this session yet
}

}  // namespace
}  // namespace paraflow
