// Converted fetches among a group's members, built on endpoints: each member registers its buffer's memory (layout
// and contents) with an endpoint of its own, the metadata goes round the communicator once, and a fetch is a
// converted read (converted_read.cpp) from the members it names. So the group form and the one between peers that
// meet at run time are one code path over the same transports.
#include "kvcomm/converted_fetch.hpp"

#include <algorithm>
#include <cstring>
#include <optional>
#include <utility>

#include "comm/agreement.hpp"
#include "common/check.hpp"
#include "kvcomm/endpoint.hpp"

namespace kvcomm {

namespace {

constexpr const char* kCreate = "ConvertedFetcher::create";
constexpr const char* kFetch = "ConvertedFetcher::fetch";

// Every member's bytes (collective): the lengths first, then every member's bytes padded to the longest.
std::vector<std::vector<uint8_t>> allgatherBytes(Communicator& comm, const std::vector<uint8_t>& mine) {
  const size_t n = static_cast<size_t>(comm.size()), me = static_cast<size_t>(comm.rank());
  std::vector<uint64_t> lengths(n);
  lengths[me] = mine.size();
  comm.allgather(lengths.data(), sizeof(uint64_t));
  const uint64_t most = *std::max_element(lengths.begin(), lengths.end());
  std::vector<uint8_t> all(most * n);
  if (!mine.empty()) std::memcpy(all.data() + me * most, mine.data(), mine.size());
  comm.allgather(all.data(), most);
  std::vector<std::vector<uint8_t>> out(n);
  for (size_t r = 0; r < n; ++r) out[r].assign(all.begin() + r * most, all.begin() + r * most + lengths[r]);
  return out;
}

}  // namespace

struct ConvertedFetcher::Impl {
  int rank = 0;
  Endpoint endpoint;
  Registration mine;
  std::vector<RemoteMemory> members;      // by rank; this member's own entry is empty
  std::optional<ConvertedReader> reader;  // holds the endpoint: declared after it, destroyed before it

  ~Impl() {
    reader.reset();
    if (endpoint.valid()) endpoint.close();  // waits for transfers it serves, then stops listening
  }
};

ConvertedFetcher ConvertedFetcher::create(SymmetricBuffer& buffer, const KvLayout& layout,
                                          const KvDescription& contents, const ConvertedFetcherOptions& options) {
  KVCOMM_CHECK_ARG(buffer.valid(), kCreate, "an empty SymmetricBuffer");
  auto impl = std::make_unique<Impl>();
  Communicator& comm = buffer.communicator();
  impl->rank = comm.rank();
  // This member's own part (its description, its endpoint and registration), then a vote: a member that failed
  // makes every member throw, naming it, before anyone waits for its metadata.
  detail::allSucceed(comm, kCreate, [&] {
    checkDescription(layout, contents, kCreate);
    EndpointOptions eo;
    eo.name = detail::cat("member ", impl->rank);
    eo.tcpAddress = options.tcpAddress;
    eo.timeoutMs = options.netTimeoutMs;
    impl->endpoint = Endpoint::create(eo);
    RegisterOptions ro;
    ro.contents = contents;
    impl->mine = impl->endpoint.registerBuffer(buffer, layout, ro);
  });
  const std::vector<std::vector<uint8_t>> metadata = allgatherBytes(comm, impl->mine.metadata());
  impl->members.resize(metadata.size());
  for (size_t r = 0; r < metadata.size(); ++r)
    if (static_cast<int>(r) != impl->rank) impl->members[r] = impl->endpoint.connect(metadata[r]);
  impl->reader.emplace(impl->endpoint);
  return ConvertedFetcher(std::move(impl));
}

ConvertedFetcher::ConvertedFetcher() = default;
ConvertedFetcher::~ConvertedFetcher() = default;
ConvertedFetcher::ConvertedFetcher(ConvertedFetcher&&) noexcept = default;
ConvertedFetcher& ConvertedFetcher::operator=(ConvertedFetcher&&) noexcept = default;
ConvertedFetcher::ConvertedFetcher(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}

namespace {
ConvertedFetcher::Impl& require(const std::unique_ptr<ConvertedFetcher::Impl>& impl, const char* call) {
  KVCOMM_CHECK_ARG(impl != nullptr, call, "an empty ConvertedFetcher (default-constructed or moved from)");
  return *impl;
}
}  // namespace

ConvertedReadResult ConvertedFetcher::fetch(const std::vector<int>& sources, const KvTokenRange& tokens,
                                            const ConvertedReadOptions& options) {
  Impl& f = require(impl_, kFetch);
  const int n = static_cast<int>(f.members.size());
  KVCOMM_CHECK_ARG(!sources.empty(), kFetch, "no sources");
  std::vector<ConvertedSource> list;
  list.reserve(sources.size());
  for (size_t i = 0; i < sources.size(); ++i) {
    const int r = sources[i];
    KVCOMM_CHECK_ARG(r >= 0 && r < n, kFetch, "source ", i, " is member ", r, ", outside the group (0 to ", n - 1, ")");
    KVCOMM_CHECK_ARG(r != f.rank, kFetch, "source ", i, " is this member (", r,
                     "): a member does not fetch from itself");
    KVCOMM_CHECK_ARG(std::find(sources.begin(), sources.begin() + static_cast<std::ptrdiff_t>(i), r) ==
                         sources.begin() + static_cast<std::ptrdiff_t>(i),
                     kFetch, "source ", i, " repeats member ", r);
    list.push_back({f.members[static_cast<size_t>(r)], {}});
  }
  ConvertedReadResult res = f.reader->read(f.mine, {}, list, tokens, options);
  for (auto* v : {&res.sourcesRead, &res.sourcesMapped})
    for (int32_t& s : *v) s = sources[static_cast<size_t>(s)];
  return res;
}

namespace {
// The fetcher, `rank` checked to be a member of its group.
ConvertedFetcher::Impl& requireMember(const std::unique_ptr<ConvertedFetcher::Impl>& impl, int rank, const char* call) {
  ConvertedFetcher::Impl& f = require(impl, call);
  KVCOMM_CHECK_ARG(rank >= 0 && rank < static_cast<int>(f.members.size()), call, "member ", rank,
                   " is outside the group of ", f.members.size());
  return f;
}
}  // namespace

// Another member's as its metadata carries them; this member's from its own registration.
const KvLayout& ConvertedFetcher::layout(int rank) const {
  ConvertedFetcher::Impl& f = requireMember(impl_, rank, "ConvertedFetcher::layout");
  return rank == f.rank ? f.mine.layout() : f.members[static_cast<size_t>(rank)].layout();
}

const KvDescription& ConvertedFetcher::contents(int rank) const {
  ConvertedFetcher::Impl& f = requireMember(impl_, rank, "ConvertedFetcher::contents");
  return rank == f.rank ? f.mine.contents() : f.members[static_cast<size_t>(rank)].contents();
}

int ConvertedFetcher::rank() const {
  return require(impl_, "ConvertedFetcher::rank").rank;
}

int ConvertedFetcher::size() const {
  return static_cast<int>(require(impl_, "ConvertedFetcher::size").members.size());
}

}  // namespace kvcomm
