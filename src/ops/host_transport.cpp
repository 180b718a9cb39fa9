#include <cstring>
#include <vector>

#include "common/check.hpp"
#include "ops/fallback_transport.hpp"

namespace kvcomm::detail {

namespace {

class HostTransport : public FallbackTransport {
 public:
  explicit HostTransport(Communicator& comm) : comm_(comm) {}

  char* sendBuffer(size_t recordBytes, Stream) override {
    if (send_.size() < recordBytes) send_.resize(recordBytes);
    return send_.data();
  }

  const char* gather(size_t recordBytes, Stream) override {
    // Records must be equal in size on every rank; say which rank differs rather than failing inside the allgather.
    std::vector<uint64_t> sizes(static_cast<size_t>(comm_.size()));
    sizes[static_cast<size_t>(comm_.rank())] = recordBytes;
    comm_.allgather(sizes.data(), sizeof(uint64_t));
    for (int r = 0; r < comm_.size(); ++r)
      KVCOMM_CHECK_ARG(sizes[static_cast<size_t>(r)] == recordBytes, "publish (fallback)", "rank ", r,
                       " publishes a record of ", sizes[static_cast<size_t>(r)], " bytes, this rank ", recordBytes,
                       ": every member must pass the same numTokens and row sizes (pad with slot -1)");
    recv_.resize(recordBytes * static_cast<size_t>(comm_.size()));
    std::memcpy(recv_.data() + recordBytes * static_cast<size_t>(comm_.rank()), send_.data(), recordBytes);
    comm_.allgather(recv_.data(), recordBytes);
    return recv_.data();
  }

  void barrier(Stream) override { comm_.barrier(); }

 private:
  Communicator comm_;
  std::vector<char> send_, recv_;
};

}  // namespace

std::unique_ptr<FallbackTransport> makeHostTransport(Communicator& comm) {
  return std::make_unique<HostTransport>(comm);
}

}  // namespace kvcomm::detail
