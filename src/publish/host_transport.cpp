#include <cstring>
#include <string>
#include <vector>

#include "common/check.hpp"
#include "publish/fallback_transport.hpp"

namespace kvcomm::detail {

namespace {

class HostTransport : public FallbackTransport {
 public:
  explicit HostTransport(Communicator& comm) : comm_(comm) {}

  char* sendBuffer(size_t recordBytes, Stream) override {
    if (send_.size() < recordBytes) send_.resize(recordBytes);
    return send_.data();
  }

  const char* gather(size_t recordBytes, const Shape& shape, Stream) override {
    // Every member's call must have the same shape; say which rank differs rather than gathering records that would
    // be read with this rank's layout (equal sizes are not enough: 1 token of 32 B is 2 of 16 B).
    std::vector<Shape> shapes(static_cast<size_t>(comm_.size()));
    shapes[static_cast<size_t>(comm_.rank())] = shape;
    comm_.allgather(shapes.data(), sizeof(Shape));
    for (int r = 0; r < comm_.size(); ++r)
      KVCOMM_CHECK_ARG(shapes[static_cast<size_t>(r)] == shape, "publish (fallback)", "rank ", r, " publishes ",
                       describe(shapes[static_cast<size_t>(r)]), ", this rank ", describe(shape),
                       ": every member must pass the same numTokens and row sizes (pad with slot -1)");
    recv_.resize(recordBytes * static_cast<size_t>(comm_.size()));
    std::memcpy(recv_.data() + recordBytes * static_cast<size_t>(comm_.rank()), send_.data(), recordBytes);
    comm_.allgather(recv_.data(), recordBytes);
    return recv_.data();
  }

  void barrier(Stream) override { comm_.barrier(); }

 private:
  static std::string describe(const Shape& s) {
    std::string rows;
    for (uint64_t k = 0; k < s.numTensors && k < 4; ++k) rows += (k ? ", " : "") + std::to_string(s.rowBytes[k]);
    return cat(s.numTokens, " tokens of ", s.numTensors, " tensors with rows of (", rows, ") bytes");
  }

  Communicator comm_;
  std::vector<char> send_, recv_;
};

}  // namespace

std::unique_ptr<FallbackTransport> makeHostTransport(Communicator& comm) {
  return std::make_unique<HostTransport>(comm);
}

}  // namespace kvcomm::detail
