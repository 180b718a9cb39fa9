// One way for tests to expect a kvcomm error: the call throws kvcomm::Error with the given code, and its message
// holds every fragment (the call's name, the value, the reason).
#pragma once

#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "kvcomm/error.hpp"

namespace kvtest {

template <typename Fn>
void expectError(Fn&& fn, kvcomm::ErrorCode code, const std::vector<std::string>& fragments) {
  try {
    fn();
    ADD_FAILURE() << "no error; expected " << kvcomm::errorCodeName(code) << " naming "
                  << (fragments.empty() ? std::string("anything") : fragments[0]);
  } catch (const kvcomm::Error& e) {
    EXPECT_EQ(e.code(), code) << e.what();
    for (const std::string& f : fragments) EXPECT_NE(std::string(e.what()).find(f), std::string::npos) << e.what();
  }
}

}  // namespace kvtest
