#include <gtest/gtest.h>

#include <string>

#include "common/check.hpp"
#include "kvcomm/error.hpp"

namespace {

TEST(Errors, MessageNamesCallRankAndCause) {
  kvcomm::detail::RankScope scope(3);
  try {
    KVCOMM_CHECK_ARG(1 + 1 == 3, "SymmetricBuffer::grow", "newBytes ", 42, " below mapped ", 64);
    FAIL() << "no throw";
  } catch (const kvcomm::InvalidArgumentError& e) {
    std::string m = e.what();
    EXPECT_EQ(e.code(), kvcomm::ErrorCode::InvalidArgument);
    EXPECT_NE(m.find("[rank 3]"), std::string::npos) << m;
    EXPECT_NE(m.find("SymmetricBuffer::grow"), std::string::npos) << m;
    EXPECT_NE(m.find("newBytes 42 below mapped 64"), std::string::npos) << m;
  }
}

TEST(Errors, SystemErrorKeepsErrno) {
  try {
    KVCOMM_CHECK_SYS(::close(-1));
    FAIL() << "no throw";
  } catch (const kvcomm::SystemError& e) {
    EXPECT_EQ(e.sysErrno(), EBADF);
    EXPECT_NE(std::string(e.what()).find("close(-1)"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("Bad file descriptor"), std::string::npos) << e.what();
  }
}

TEST(Errors, RankScopeNestsAndRestores) {
  EXPECT_EQ(kvcomm::detail::currentRank(), -1);
  {
    kvcomm::detail::RankScope a(1);
    {
      kvcomm::detail::RankScope b(7);
      EXPECT_EQ(kvcomm::detail::currentRank(), 7);
    }
    EXPECT_EQ(kvcomm::detail::currentRank(), 1);
  }
  EXPECT_EQ(kvcomm::detail::currentRank(), -1);
}

TEST(Errors, CodeNames) {
  EXPECT_STREQ(kvcomm::errorCodeName(kvcomm::ErrorCode::Timeout), "Timeout");
  EXPECT_STREQ(kvcomm::errorCodeName(kvcomm::ErrorCode::RemoteError), "RemoteError");
  EXPECT_STREQ(kvcomm::errorCodeName(kvcomm::ErrorCode::Busy), "Busy");
}

}  // namespace
