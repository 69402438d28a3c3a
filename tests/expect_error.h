// Checks that a call throws, and that its message says what the tests promise users it says.
#pragma once

#include <gtest/gtest.h>

#include <string>
#include <vector>

namespace paraflow::testing {

// Runs `call`, expecting an ErrorType whose message holds each of `says`.
template <typename ErrorType, typename Call>
void expect_error(Call call, const std::vector<std::string>& says) {
  try {
    call();
    ADD_FAILURE() << "accepted";
  } catch (const ErrorType& error) {
    for (const std::string& part : says) EXPECT_NE(std::string(error.what()).find(part), std::string::npos) << error.what();
  }
}

}  // namespace paraflow::testing
