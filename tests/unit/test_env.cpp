// Every KVCOMM_* knob is parsed strictly: accepted spellings, the default when unset or empty, and for anything else
// an InvalidArgumentError naming the variable, the value and what is accepted.
#include <gtest/gtest.h>

#include <cstdlib>
#include <functional>
#include <string>
#include <vector>

#include "common/env.hpp"
#include "kvcomm/bootstrap.hpp"
#include "kvcomm/capabilities.hpp"
#include "kvcomm/comm.hpp"
#include "kvcomm/error.hpp"
#include "kvcomm/fetch.hpp"
#include "support/scoped_env.hpp"

namespace {

using kvtest::ScopedEnv;

namespace env = kvcomm::env;

// Sets (or unsets, with nullptr) one variable for the scope.
// `read` must throw InvalidArgumentError whose message names the variable, the value and every accepted spelling.
void expectRejected(const char* name, const char* value, const std::function<void()>& read,
                    const std::vector<std::string>& accepted) {
  ScopedEnv e(name, value);
  try {
    read();
    ADD_FAILURE() << name << "=" << value << " was accepted";
  } catch (const kvcomm::InvalidArgumentError& err) {
    std::string m = err.what();
    EXPECT_NE(m.find(std::string(name) + "='" + value + "'"), std::string::npos) << m;
    for (const auto& a : accepted) EXPECT_NE(m.find(a), std::string::npos) << "missing '" << a << "' in: " << m;
  }
  // validate() reports the same variable.
  try {
    env::validate();
    ADD_FAILURE() << "validate() accepted " << name << "=" << value;
  } catch (const kvcomm::InvalidArgumentError& err) {
    EXPECT_NE(std::string(err.what()).find(name), std::string::npos) << err.what();
  }
}

TEST(Env, DirectAcceptsItsSpellingsAndRejectsTheRest) {
  {
    ScopedEnv e("KVCOMM_DIRECT", nullptr);
    EXPECT_EQ(env::choice(env::kDirect), 0);
  }
  for (const char* v : {"", "auto", "AUTO"}) {
    ScopedEnv e("KVCOMM_DIRECT", v);
    EXPECT_EQ(env::choice(env::kDirect), 0) << v;
  }
  for (const char* v : {"1", "on", "On", "force", "FORCE"}) {
    ScopedEnv e("KVCOMM_DIRECT", v);
    EXPECT_EQ(env::choice(env::kDirect), 1) << v;
  }
  for (const char* v : {"0", "off", "OFF"}) {
    ScopedEnv e("KVCOMM_DIRECT", v);
    EXPECT_EQ(env::choice(env::kDirect), 2) << v;
  }
  for (const char* v : {"yes", "2", "true", " 1", "direct"})
    expectRejected("KVCOMM_DIRECT", v, [] { env::choice(env::kDirect); }, {"auto", "force", "off"});
  EXPECT_STREQ(env::word(env::kDirect, 1), "1");
  EXPECT_STREQ(env::word(env::kDirect, 2), "0");
  EXPECT_STREQ(env::word(env::kDirect, 0), "auto");
}

TEST(Env, LogLevelIsStrictButTheLoggerNeverThrows) {
  const std::pair<const char*, int> good[] = {{"error", 0}, {"WARN", 1}, {"info", 2}, {"Debug", 3}, {"", 1}};
  for (auto [v, level] : good) {
    ScopedEnv e("KVCOMM_LOG_LEVEL", v);
    EXPECT_EQ(env::logLevel(), level) << v;
    EXPECT_EQ(env::logLevelOrWarn(), level) << v;
  }
  expectRejected("KVCOMM_LOG_LEVEL", "verbose", [] { env::logLevel(); }, {"error", "warn", "info", "debug"});
  ScopedEnv e("KVCOMM_LOG_LEVEL", "3");
  EXPECT_EQ(env::logLevelOrWarn(), 1);
}

TEST(Env, TimeoutsAreWholeMillisecondsInRange) {
  {
    ScopedEnv a("KVCOMM_BOOTSTRAP_TIMEOUT_MS", nullptr), b("KVCOMM_BARRIER_TIMEOUT_MS", "");
    EXPECT_EQ(env::bootstrapTimeoutMs(), 120000);
    EXPECT_EQ(env::barrierTimeoutMs(), 10000);
  }
  {
    ScopedEnv a("KVCOMM_BOOTSTRAP_TIMEOUT_MS", "-1"), b("KVCOMM_BARRIER_TIMEOUT_MS", "0");
    EXPECT_EQ(env::bootstrapTimeoutMs(), -1);
    EXPECT_EQ(env::barrierTimeoutMs(), 0);
  }
  {
    ScopedEnv a("KVCOMM_BOOTSTRAP_TIMEOUT_MS", "+2500"), b("KVCOMM_BARRIER_TIMEOUT_MS", "86400000");
    EXPECT_EQ(env::bootstrapTimeoutMs(), 2500);
    EXPECT_EQ(env::barrierTimeoutMs(), 86400000);
  }
  for (const char* v : {"10s", "1e3", "12.5", "abc", "99999999999999999999", "1000000000001", " 5000", "\t5000",
                        "\n5000", "5000 ", "+ 5", "- 5", "+-5", "0x10"})
    expectRejected("KVCOMM_BOOTSTRAP_TIMEOUT_MS", v, [] { env::bootstrapTimeoutMs(); },
                   {"integer number of milliseconds", "negative for no bound"});
  for (const char* v : {"-1", "86400001", "5ms", "fast", " 100", "\v100"})
    expectRejected("KVCOMM_BARRIER_TIMEOUT_MS", v, [] { env::barrierTimeoutMs(); }, {"from 0 to 86400000"});
}

TEST(Env, SocketIfnameMustBeAnInterfaceName) {
  {
    ScopedEnv e("KVCOMM_SOCKET_IFNAME", "eth0");
    EXPECT_EQ(env::socketIfname(), "eth0");
  }
  for (const char* v : {"a-name-longer-than-15", "eth0 ", "eth/0", "10.0.0.1:80"})
    expectRejected("KVCOMM_SOCKET_IFNAME", v, [] { env::socketIfname(); }, {"1 to 15 characters"});
}

TEST(Env, HandleTypeAcceptsItsSpellingsAndRejectsTheRest) {
  const std::pair<const char*, env::HandleType> good[] = {
      {"", env::HandleType::Auto},         {"auto", env::HandleType::Auto}, {"posix_fd", env::HandleType::PosixFd},
      {"fabric", env::HandleType::Fabric}, {"ipc", env::HandleType::Ipc},   {"cuda_ipc", env::HandleType::Ipc},
      {"LEGACY", env::HandleType::Ipc}};
  for (auto [v, type] : good) {
    ScopedEnv e("KVCOMM_HANDLE_TYPE", v);
    EXPECT_EQ(env::handleType(), type) << v;
  }
  for (const char* v : {"fd", "posix", "vmm", "nvlink"})
    expectRejected("KVCOMM_HANDLE_TYPE", v, [] { env::handleType(); }, {"auto", "posix_fd", "fabric", "ipc"});
}

TEST(Env, DependentLaunchIsOnByDefaultAndZeroOrOne) {
  {
    ScopedEnv e("KVCOMM_PDL", nullptr);
    EXPECT_TRUE(env::dependentLaunch());
  }
  {
    ScopedEnv e("KVCOMM_PDL", "0");
    EXPECT_FALSE(env::dependentLaunch());
  }
  expectRejected("KVCOMM_PDL", "off", [] { env::dependentLaunch(); }, {"0 or 1"});
}

TEST(Env, FallbackPackMaxBytesDefaultsTo256KiBAndIsANonNegativeInteger) {
  {
    ScopedEnv e("KVCOMM_FALLBACK_PACK_MAX_BYTES", nullptr);
    EXPECT_EQ(env::fallbackPackMaxBytes(), 262144);
  }
  {
    ScopedEnv e("KVCOMM_FALLBACK_PACK_MAX_BYTES", "0");
    EXPECT_EQ(env::fallbackPackMaxBytes(), 0);
  }
  for (const char* v : {"-1", "256k", "1e6"})
    expectRejected("KVCOMM_FALLBACK_PACK_MAX_BYTES", v, [] { env::fallbackPackMaxBytes(); }, {"bytes >= 0"});
}

TEST(Env, MulticastIsZeroOrOne) {
  {
    ScopedEnv e("KVCOMM_MULTICAST", "1");
    EXPECT_TRUE(env::multicastRequested());
  }
  {
    ScopedEnv e("KVCOMM_MULTICAST", "0");
    EXPECT_FALSE(env::multicastRequested());
  }
  expectRejected("KVCOMM_MULTICAST", "yes", [] { env::multicastRequested(); }, {"0 or 1"});
  // capabilities() never throws: a value that is not accepted becomes the refusal reason.
  ScopedEnv a("KVCOMM_MULTICAST", "on"), b("NCCL_NVLS_ENABLE", nullptr), c("TORCH_SYMM_MEM_DISABLE_MULTICAST", nullptr),
      d("NVSHMEM_DISABLE_NVLS", nullptr);
  EXPECT_NE(env::multicastRefusal().find("KVCOMM_MULTICAST='on' is not accepted"), std::string::npos)
      << env::multicastRefusal();
}

TEST(Env, FetchPathAcceptsItsSpellingsInFetchPathsOrderAndRejectsTheRest) {
  const std::pair<const char*, kvcomm::FetchPath> good[] = {
      {"", kvcomm::FetchPath::Auto},         {"AUTO", kvcomm::FetchPath::Auto},
      {"kernel", kvcomm::FetchPath::Kernel}, {"copy", kvcomm::FetchPath::CopyEngine},
      {"Ce", kvcomm::FetchPath::CopyEngine}, {"host", kvcomm::FetchPath::Host}};
  for (auto [v, path] : good) {
    ScopedEnv e("KVCOMM_FETCH_PATH", v);
    EXPECT_EQ(env::choice(env::kFetchPath), static_cast<int>(path)) << v;
  }
  EXPECT_STREQ(env::word(env::kFetchPath, 2), "copy");
  EXPECT_STREQ(env::word(env::kFetchPath, 7), "?");
  for (const char* v : {"network", "gpu", "copy ", "1"})
    expectRejected("KVCOMM_FETCH_PATH", v, [] { env::choice(env::kFetchPath); }, {"auto", "kernel", "copy", "host"});
}

TEST(Env, FetchTransportKnobsAreStrict) {
  const std::pair<const char*, int> good[] = {{"", 0}, {"auto", 0}, {"peer", 1}, {"RDMA", 2}, {"tcp", 3}};
  for (auto [v, knob] : good) {
    ScopedEnv e("KVCOMM_FETCH_TRANSPORT", v);
    EXPECT_EQ(env::choice(env::kFetchTransport), knob) << v;
  }
  EXPECT_STREQ(env::word(env::kFetchTransport, 2), "rdma");
  for (const char* v : {"ib", "verbs", "nvlink", "tcp "})
    expectRejected("KVCOMM_FETCH_TRANSPORT", v, [] { env::choice(env::kFetchTransport); },
                   {"auto", "peer", "rdma", "tcp"});
  {
    ScopedEnv a("KVCOMM_FETCH_NET_TIMEOUT_MS", nullptr), b("KVCOMM_FETCH_TCP_CONNECTIONS", "");
    EXPECT_EQ(env::fetchNetTimeoutMs(), 3000);
    EXPECT_EQ(env::fetchTcpConnections(), 4);
  }
  {
    ScopedEnv a("KVCOMM_FETCH_NET_TIMEOUT_MS", "100"), b("KVCOMM_FETCH_TCP_CONNECTIONS", "16");
    EXPECT_EQ(env::fetchNetTimeoutMs(), 100);
    EXPECT_EQ(env::fetchTcpConnections(), 16);
  }
  for (const char* v : {"99", "-1", "3s", "86400001"})
    expectRejected("KVCOMM_FETCH_NET_TIMEOUT_MS", v, [] { env::fetchNetTimeoutMs(); }, {"from 100 to 86400000"});
  for (const char* v : {"0", "17", "many", " 4", "\f4"})
    expectRejected("KVCOMM_FETCH_TCP_CONNECTIONS", v, [] { env::fetchTcpConnections(); }, {"from 1 to 16"});
}

TEST(Env, ABadKnobStopsTheBootstrapAndTheCommunicatorBeforeAnyWait) {
  ScopedEnv e("KVCOMM_HANDLE_TYPE", "posix");  // read by no bootstrap call, still refused up front
  kvcomm::UniqueId id = kvcomm::TcpBootstrap::createUniqueId();
  EXPECT_THROW(kvcomm::TcpBootstrap(id, 0, 2, 60000), kvcomm::InvalidArgumentError);  // no 60 s wait for rank 1
  auto boot = std::make_shared<kvcomm::CallbackBootstrap>(0, 1, [](const void*, void*, size_t) {});
  try {
    kvcomm::Communicator::create(boot);
    ADD_FAILURE() << "Communicator::create accepted KVCOMM_HANDLE_TYPE=posix";
  } catch (const kvcomm::InvalidArgumentError& err) {
    EXPECT_NE(std::string(err.what()).find("KVCOMM_HANDLE_TYPE='posix'"), std::string::npos) << err.what();
  }
}

}  // namespace
