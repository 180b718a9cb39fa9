// SCM_RIGHTS edge cases in one process: truncated descriptors are detected, reported and closed.
#include <gtest/gtest.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <unistd.h>

#include <string>

#include "common/fd.hpp"
#include "kvcomm/error.hpp"
#include "symm/fd_exchange.hpp"
#include "verify/memory.hpp"

namespace {

TEST(FdExchange, TruncatedDescriptorsAreReportedAndClosed) {
  int sv[2];
  ASSERT_EQ(socketpair(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0, sv), 0);
  kvcomm::detail::Fd a(sv[0]), b(sv[1]);
  int fds[3];
  for (int& f : fds) f = memfd_create("trunc", MFD_CLOEXEC);
  uint32_t payload = 3;
  kvcomm::detail::sendWithFds(a.get(), &payload, sizeof(payload), fds, 3);
  for (int f : fds) close(f);  // only the in-flight copies remain
  int before = kvtest::countFds();
  uint32_t got = 0;
  size_t len = sizeof(got);
  try {
    kvcomm::detail::recvWithFds(b.get(), &got, &len, 1);  // room for one descriptor, three attached
    FAIL() << "truncation went unnoticed";
  } catch (const kvcomm::NetworkError& e) {
    EXPECT_NE(std::string(e.what()).find("MSG_CTRUNC"), std::string::npos) << e.what();
  }
  EXPECT_EQ(kvtest::countFds(), before) << "a stray descriptor survived the truncated receive";
}

TEST(FdExchange, DescriptorsArriveWithTheirPayload) {
  int sv[2];
  ASSERT_EQ(socketpair(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0, sv), 0);
  kvcomm::detail::Fd a(sv[0]), b(sv[1]);
  int f = memfd_create("ok", MFD_CLOEXEC);
  ASSERT_EQ(ftruncate(f, 12345), 0);
  uint32_t payload = 1, got = 0;
  kvcomm::detail::sendWithFds(a.get(), &payload, sizeof(payload), &f, 1);
  close(f);
  size_t len = sizeof(got);
  auto fds = kvcomm::detail::recvWithFds(b.get(), &got, &len, 4);
  ASSERT_EQ(fds.size(), 1u);
  EXPECT_EQ(got, 1u);
  EXPECT_EQ(lseek(fds[0].get(), 0, SEEK_END), 12345);
}

TEST(FdExchange, UnknownServerIsAClearError) {
  kvcomm::detail::Token t{};
  try {
    kvcomm::detail::fetchFds("kvcomm-no-such-server", t, 1, 1, 0, 1000);
    FAIL() << "connected to a server that does not exist";
  } catch (const kvcomm::NetworkError& e) {
    EXPECT_NE(std::string(e.what()).find("kvcomm-no-such-server"), std::string::npos) << e.what();
  }
}

}  // namespace
