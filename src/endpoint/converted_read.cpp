// Converted reads over endpoints, in three phases:
//   1. plan against the sources' own layouts (every check runs here, before anything moves) and find the source
//      blocks the tokens need;
//   2. land those blocks of each source used, whole, in a host landing area laid out as the source's regions with
//      the blocks packed (an ordinary Endpoint::read: any transport, every check the owner runs);
//   3. plan again against the landing areas and copy the pieces into the local registration -- only once every
//      source landed, so a failure leaves the local memory as it was.
#include "kvcomm/converted_read.hpp"

#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <memory>
#include <mutex>
#include <unordered_map>

#include "common/check.hpp"
#include "common/log.hpp"

namespace kvcomm {

namespace {

constexpr const char* kCall = "readConverted";

struct FreeBytes {
  void operator()(uint8_t* p) const noexcept { std::free(p); }
};

bool sameLayout(const KvLayout& a, const KvLayout& b) {
  if (a.regions.size() != b.regions.size()) return false;
  for (size_t i = 0; i < a.regions.size(); ++i)
    if (a.regions[i].offset != b.regions[i].offset || a.regions[i].blockBytes != b.regions[i].blockBytes ||
        a.regions[i].numBlocks != b.regions[i].numBlocks)
      return false;
  return true;
}

// A source position's landing area: host memory registered with the endpoint, kept between reads of a reader.
struct Landing {
  Endpoint* endpoint = nullptr;
  std::unique_ptr<uint8_t, FreeBytes> memory;
  uint64_t capacity = 0;
  uint64_t bytes = 0;
  KvLayout layout;
  Registration registration;

  Landing() = default;
  Landing(Landing&&) = default;
  Landing& operator=(Landing&&) = delete;
  ~Landing() { unregister(); }

  void unregister() noexcept {
    if (!registration.valid()) return;
    if (!registration.registered()) {  // the endpoint closed (it unregistered everything)
      registration = Registration();
      return;
    }
    try {
      endpoint->unregister(registration);
    } catch (const std::exception& e) {
      KVCOMM_WARN(kCall, ": unregistering a landing area: ", e.what());
    }
    registration = Registration();
  }

  // Laid out as `want` (`need` bytes): the memory grows when too small, the registration follows the layout.
  void prepare(Endpoint& ep, const KvLayout& want, uint64_t need) {
    endpoint = &ep;
    if (registration.valid() && bytes == need && sameLayout(layout, want)) return;
    unregister();
    if (need > capacity) {
      const uint64_t rounded = (need + 4095) / 4096 * 4096;
      memory.reset(static_cast<uint8_t*>(std::aligned_alloc(4096, rounded)));
      if (!memory) KVCOMM_THROW(SystemError, kCall, "cannot allocate a landing area of ", rounded, " bytes");
      capacity = rounded;
    }
    layout = want;
    bytes = need;
    registration = ep.registerMemory(memory.get(), bytes, MemoryKind::Host, layout);
  }
};

}  // namespace

struct ConvertedReader::Impl {
  Endpoint* endpoint = nullptr;
  std::mutex mu;
  std::vector<Landing> landings;  // by source position
};

ConvertedReader::ConvertedReader(Endpoint& endpoint) : impl_(std::make_unique<Impl>()) {
  KVCOMM_CHECK_ARG(endpoint.valid(), "ConvertedReader", "empty endpoint");
  impl_->endpoint = &endpoint;
}
ConvertedReader::~ConvertedReader() = default;
ConvertedReader::ConvertedReader(ConvertedReader&&) noexcept = default;
ConvertedReader& ConvertedReader::operator=(ConvertedReader&&) noexcept = default;

uint64_t ConvertedReader::landingBytes() const {
  KVCOMM_CHECK_ARG(impl_, "ConvertedReader::landingBytes", "empty reader (moved from)");
  std::lock_guard<std::mutex> lock(impl_->mu);
  uint64_t n = 0;
  for (const Landing& l : impl_->landings) n += l.capacity;
  return n;
}

ConvertedReadResult readConverted(Endpoint& endpoint, const Registration& local, const KvDescription& localContents,
                                  const std::vector<ConvertedSource>& sources, const KvTokenRange& tokens,
                                  const ConvertedReadOptions& options) {
  KVCOMM_CHECK_ARG(endpoint.valid(), kCall, "empty endpoint");
  ConvertedReader reader(endpoint);
  return reader.read(local, localContents, sources, tokens, options);
}

ConvertedReadResult ConvertedReader::read(const Registration& local, const KvDescription& localContents,
                                          const std::vector<ConvertedSource>& sources, const KvTokenRange& tokens,
                                          const ConvertedReadOptions& options) {
  KVCOMM_CHECK_ARG(impl_, kCall, "empty reader (moved from)");
  std::lock_guard<std::mutex> readerLock(impl_->mu);
  Endpoint& endpoint = *impl_->endpoint;
  KVCOMM_CHECK_ARG(endpoint.valid(), kCall, "the reader's endpoint is closed");
  KVCOMM_CHECK_ARG(local.valid() && local.registered(), kCall, "the local registration is empty or unregistered");
  if (local.kind() != MemoryKind::Host)
    KVCOMM_THROW(Unsupported, kCall,
                 "converted reads write host registrations for now: the local registration is CUDA memory");
  for (size_t s = 0; s < sources.size(); ++s)
    KVCOMM_CHECK_ARG(sources[s].remote.valid(), kCall, "source ", s, ": empty RemoteMemory");
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::milliseconds(options.timeoutMs);

  // ---- phase 1: the plan against the sources' layouts (all checks), and the source blocks the tokens need ----
  std::vector<KvConversionSource> real;
  for (const ConvertedSource& s : sources) real.push_back({s.remote.layout(), s.contents});
  const KvConversionPlan first = planConversion(real, local.layout(), localContents, tokens, options.conversion);
  ConvertedReadResult result;
  const uint64_t sT = sources[0].contents.regions.empty() ? 1 : sources[0].contents.regions[0].tokensPerBlock;
  const uint64_t dT = localContents.regions.empty() ? 1 : localContents.regions[0].tokensPerBlock;
  std::vector<int64_t> remoteIds, localTouched;
  std::unordered_map<int64_t, int64_t> landingId;  // remote block id -> its block in a landing area
  for (uint64_t t = tokens.firstToken; t < tokens.firstToken + tokens.numTokens; ++t) {
    const int64_t sb = tokens.srcBlocks[t / sT], db = tokens.dstBlocks[t / dT];
    if (sb < 0 || db < 0) continue;
    if (landingId.emplace(sb, static_cast<int64_t>(remoteIds.size())).second) remoteIds.push_back(sb);
    if (localTouched.empty() || localTouched.back() != db) localTouched.push_back(db);
  }
  std::vector<int64_t> packed(remoteIds.size());
  for (size_t i = 0; i < packed.size(); ++i) packed[i] = static_cast<int64_t>(i);

  // ---- phase 2: land the needed blocks of every source used ----
  std::vector<Landing>& landings = impl_->landings;
  if (landings.size() < sources.size()) landings.resize(sources.size());
  std::vector<Transfer> reads(sources.size());  // waited for (destroyed) before this call returns
  for (size_t s = 0; s < sources.size(); ++s) {
    if (first.pieces[s].empty() || remoteIds.empty()) continue;
    result.sourcesRead.push_back(static_cast<int32_t>(s));
    KvLayout want;
    uint64_t at = 0;
    for (const KvRegion& r : sources[s].remote.layout().regions) {
      want.regions.push_back({at, r.blockBytes, r.blockBytes, remoteIds.size()});
      at += r.blockBytes * remoteIds.size();
    }
    Landing& l = landings[s];
    l.prepare(endpoint, want, std::max<uint64_t>(at, 1));
    TransferOptions o;
    o.via = options.via;
    reads[s] = endpoint.read(l.registration, sources[s].remote, remoteIds.data(), packed.data(), remoteIds.size(), o);
    result.bytesLanded += at;
  }
  for (int32_t s : result.sourcesRead) {
    int64_t left = -1;
    if (options.timeoutMs >= 0)
      left = std::max<int64_t>(
          0,
          std::chrono::duration_cast<std::chrono::milliseconds>(deadline - std::chrono::steady_clock::now()).count());
    FetchStatus st = reads[s].wait(left);
    if (st.state == FetchState::Done) continue;
    result.status.state = FetchState::Failed;
    result.status.error = st.state == FetchState::InProgress
                              ? detail::cat("source ", s, " (", sources[s].remote.peerName(), "): not landed within ",
                                            options.timeoutMs, " ms")
                              : detail::cat("source ", s, " (", sources[s].remote.peerName(), "): ", st.error);
    result.status.failedBlocks = localTouched;
    result.bytesLanded = 0;
    return result;  // the transfers are cancelled and waited for before the landing areas can be reused
  }

  // ---- phase 3: the plan against the landing areas, applied ----
  // Sources not read this time keep their own layout (a reader's landing area at that position may be another
  // read's); no piece comes from them.
  std::vector<KvConversionSource> landed;
  for (size_t s = 0; s < sources.size(); ++s) {
    const bool read = std::find(result.sourcesRead.begin(), result.sourcesRead.end(), static_cast<int32_t>(s)) !=
                      result.sourcesRead.end();
    landed.push_back({read ? landings[s].layout : sources[s].remote.layout(), sources[s].contents});
  }
  KvTokenRange remapped = tokens;
  for (int64_t& b : remapped.srcBlocks) {
    auto it = landingId.find(b);
    b = it == landingId.end() ? -1 : it->second;
  }
  const KvConversionPlan plan = planConversion(landed, local.layout(), localContents, remapped, options.conversion);
  for (int32_t s : result.sourcesRead)
    applyConversion(plan.pieces[s], landings[s].memory.get(), landings[s].bytes, local.data(), local.bytes());
  result.status.state = FetchState::Done;
  result.status.bytesDone = result.status.bytesTotal = plan.bytes;
  result.bytesConverted = plan.bytes;
  result.pieces = plan.count();
  return result;
}

}  // namespace kvcomm
