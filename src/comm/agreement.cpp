#include "comm/agreement.hpp"

#include <cstdio>
#include <cstring>
#include <new>
#include <vector>

#include "common/check.hpp"

namespace kvcomm::detail {

MemberName worldRanksOf(const Communicator& comm) {
  return [comm](size_t r) { return cat("world rank ", comm.worldRank(static_cast<int>(r))); };
}

std::string groupRank(size_t r) {
  return cat("rank ", r);
}

Outcome Outcome::fromCurrentException() noexcept {
  Outcome o;
  try {
    throw;
  } catch (const CudaError& e) {
    o = {e.what(), e.code(), e.result()};
  } catch (const SystemError& e) {
    o = {e.what(), e.code(), e.sysErrno()};
  } catch (const Error& e) {
    o = {e.what(), e.code(), 0};
  } catch (const std::bad_alloc& e) {
    o = {cat("out of memory (", e.what(), ")"), ErrorCode::SystemError, ENOMEM};
  } catch (const std::exception& e) {
    o = {cat("unexpected ", e.what()), ErrorCode::InternalError, 0};
  } catch (...) {
    o = {"an exception of unknown type", ErrorCode::InternalError, 0};
  }
  if (o.error.empty()) o.error = "failed without a message";
  return o;
}

void Outcome::rethrow() const {
  if (!ok()) throwFormatted(code, error, detail);
}

void vote(Communicator& comm, const char* step, const Outcome& local) {
  struct Ballot {
    int32_t ok;
    int32_t code;
    int32_t detail;
    char message[500];
  };
  std::vector<Ballot> all(static_cast<size_t>(comm.size()));
  Ballot& mine = all[static_cast<size_t>(comm.rank())];
  mine.ok = local.ok() ? 1 : 0;
  mine.code = static_cast<int32_t>(local.code);
  mine.detail = local.detail;
  std::snprintf(mine.message, sizeof(mine.message), "%s", local.error.c_str());
  comm.allgather(all.data(), sizeof(Ballot));
  std::string reasons;
  const Ballot* first = nullptr;
  for (int r = 0; r < comm.size(); ++r) {
    const Ballot& b = all[static_cast<size_t>(r)];
    if (b.ok) continue;
    if (!first) first = &b;
    reasons += cat(reasons.empty() ? "" : "; ", "rank ", r, ": ",
                   std::string(b.message, strnlen(b.message, sizeof(b.message))));
  }
  if (!first) return;
  throwError(static_cast<ErrorCode>(first->code), step, cat("failed on ", reasons), __FILE__, __LINE__, first->detail);
}

}  // namespace kvcomm::detail
