// Group agreement: the "every member succeeds or every member backs off" step that every collective setup uses.
// A rank runs its failure-prone local work (driver calls, allocations, imports), then every member allgathers a
// ballot; when any member failed, every member throws the same error naming each failed rank and its cause, so no
// rank is left waiting for a peer that has already given up.
#pragma once

#include <cstddef>
#include <exception>
#include <functional>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

#include "common/check.hpp"
#include "kvcomm/comm.hpp"
#include "kvcomm/error.hpp"

namespace kvcomm::detail {

/// What one rank's local part of a collective step ended with.
struct Outcome {
  std::string error;                        ///< "" on success, else the message of what failed here
  ErrorCode code = ErrorCode::RemoteError;  ///< category of the failure
  int detail = 0;                           ///< CUresult (CudaError) or errno (SystemError) of the failure

  bool ok() const { return error.empty(); }
  /// Throws the recorded failure again (same code, message and detail); no-op on success.
  void rethrow() const;
  /// Records the exception in flight (call inside a catch block); any exception type is accepted.
  static Outcome fromCurrentException() noexcept;
  /// A failure found by a check rather than an exception.
  static Outcome failure(std::string message, ErrorCode code = ErrorCode::InvalidArgument) {
    return {std::move(message), code, 0};
  }
};

/// Collective: allgathers every member's outcome. Returns when every member succeeded; otherwise throws on every
/// rank an Error whose code (and CUresult/errno) is the first failed rank's and whose message names `step` and each
/// failed rank with its cause.
void vote(Communicator& comm, const char* step, const Outcome& local);

/// Runs `work` on this rank and votes on the outcome (collective): returns only when `work` succeeded on every
/// member. Whatever `work` throws (kvcomm::Error, std::bad_alloc, anything) becomes this rank's failed ballot.
template <typename Work>
void allSucceed(Communicator& comm, const char* step, Work&& work) {
  Outcome local;
  try {
    std::forward<Work>(work)();
  } catch (...) {
    local = Outcome::fromCurrentException();
  }
  vote(comm, step, local);
}

/// allSucceed() that also undoes this rank's local effects with `undo` when any member failed (also when `work`
/// succeeded here), before the error propagates.
template <typename Work, typename Undo>
void allSucceedOrUndo(Communicator& comm, const char* step, Work&& work, Undo&& undo) {
  try {
    allSucceed(comm, step, std::forward<Work>(work));
  } catch (...) {
    std::forward<Undo>(undo)();
    throw;
  }
}

/// How an agreement error names member r: worldRanksOf(comm) gives "world rank W", the default "rank r" (values
/// checked without a communicator).
using MemberName = std::function<std::string(size_t r)>;
MemberName worldRanksOf(const Communicator& comm);
std::string groupRank(size_t r);

/// "This value must agree on every member", on values already gathered (all[r] is member r's): when the value
/// `get(all[r])` of some member differs from member 0's, throws InvalidArgumentError naming `call`:
///   "<what> must be the same on every member: world rank 3 has <show(its)>, world rank 0 has <show(0's)>[ (<why>)]"
/// Every member checks the same data, so every member throws the same error (no vote needed).
template <typename T, typename Get, typename Show>
void requireSame(const std::vector<T>& all, Get&& get, const char* call, const std::string& what, Show&& show,
                 const MemberName& name = groupRank, const std::string& why = {}) {
  for (size_t r = 1; r < all.size(); ++r)
    if (!(get(all[r]) == get(all[0])))
      KVCOMM_THROW(InvalidArgument, call, what, " must be the same on every member: ", name(r), " has ",
                   show(get(all[r])), ", ", name(0), " has ", show(get(all[0])), why.empty() ? "" : " (", why,
                   why.empty() ? "" : ")");
}
/// The `show` of requireSame() for values shown as they print.
inline constexpr auto asPrinted = [](const auto& v) { return v; };

/// Collective: allgathers `mine` (a plain value) and requires it to be the same on every member (requireSame(), world
/// ranks named). Returns every member's value.
template <typename T>
std::vector<T> agreeOn(Communicator& comm, const T& mine, const char* call, const std::string& what,
                       const std::string& why = {}) {
  static_assert(std::is_trivially_copyable_v<T>, "agreeOn gathers the bytes of the value");
  std::vector<T> all(static_cast<size_t>(comm.size()));
  all[static_cast<size_t>(comm.rank())] = mine;
  comm.allgather(all.data(), sizeof(T));
  requireSame(all, asPrinted, call, what, asPrinted, worldRanksOf(comm), why);
  return all;
}

// Join the collective, then throw (fetchAll and its C and Python front ends): this rank's own step may fail, but
// the collective it is part of must still run on it, or the other members wait at its barriers.

/// Runs `local` (this rank's own step: validate, convert, plan); then `collective(ok)` whatever `local` did, with
/// ok == false when it threw (the collective then runs with nothing of this rank's to do); then rethrows what
/// `local` threw. An exception of `collective` itself propagates at once.
template <typename Local, typename Collective>
void joinThenThrow(Local&& local, Collective&& collective) {
  Outcome mine;
  try {
    std::forward<Local>(local)();
  } catch (...) {
    mine = Outcome::fromCurrentException();
  }
  std::forward<Collective>(collective)(mine.ok());
  mine.rethrow();
}

}  // namespace kvcomm::detail
