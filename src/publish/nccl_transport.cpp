// NCCL AllGather transport for the CUDA fallback.
#include <vector>

#include "comm/agreement.hpp"
#include "common/check.hpp"
#include "common/log.hpp"
#include "platform/cuda_driver.hpp"
#include "platform/nccl.hpp"
#include "publish/fallback_transport.hpp"

namespace kvcomm::detail {

namespace {

class NcclTransport : public FallbackTransport {
 public:
  NcclTransport(Communicator& comm, size_t recordBytes) : size_(comm.size()) {
    const char* call = "Publisher (fallback: NCCL)";
    std::vector<ncclUniqueId> ids(static_cast<size_t>(size_));
    allSucceed(comm, call, [&] {
      const NcclLib& n = requireNccl(call);
      if (comm.rank() == 0) KVCOMM_CHECK_NCCL(n.getUniqueId(&ids[0]));
    });
    comm.allgather(ids.data(), sizeof(ncclUniqueId));
    // The destructor does not run when the constructor throws: a failed vote releases what this rank made.
    allSucceedOrUndo(
        comm, call,
        [&] {
          KVCOMM_CHECK_NCCL(nccl().commInitRank(&comm_, size_, ids[0], comm.rank()));
          scratch_ = static_cast<char*>(deviceAlloc(8 * static_cast<size_t>(size_ + 1)));
          reserve(recordBytes);
        },
        [&] { release(); });
  }

  ~NcclTransport() override { release(); }

  char* sendBuffer(size_t recordBytes, Stream stream) override {
    ensureRecv(recordBytes * static_cast<size_t>(size_), stream);
    return send_;
  }

  const char* gather(size_t recordBytes, const Shape&, Stream stream) override {
    KVCOMM_CHECK_NCCL(nccl().allGather(send_, recv_, recordBytes, ncclUint8, comm_, stream));
    return recv_;
  }

  bool gathersParts() const override { return true; }

  const char* gatherParts(const std::vector<Part>& parts, Stream stream) override {
    size_t total = 0;
    for (const Part& p : parts) total += (p.bytes * static_cast<size_t>(size_) + 15) & ~size_t(15);
    ensureRecv(total, stream);
    const NcclLib& n = nccl();
    KVCOMM_CHECK_NCCL(n.groupStart());
    size_t at = 0;
    for (const Part& p : parts) {
      if (p.bytes) KVCOMM_CHECK_NCCL(n.allGather(p.src, recv_ + at, p.bytes, ncclUint8, comm_, stream));
      at += (p.bytes * static_cast<size_t>(size_) + 15) & ~size_t(15);
    }
    KVCOMM_CHECK_NCCL(n.groupEnd());
    return recv_;
  }

  void barrier(Stream stream) override {
    // 8 bytes from every rank: the send slot sits past the receive area (no overlap).
    KVCOMM_CHECK_NCCL(
        nccl().allGather(scratch_ + 8 * static_cast<size_t>(size_), scratch_, 8, ncclUint8, comm_, stream));
  }

 private:
  void release() noexcept {
    if (comm_) {
      ncclResult_t r = nccl().commDestroy(comm_);
      if (r != ncclSuccess) KVCOMM_WARN("ncclCommDestroy failed: ", nccl().getErrorString(r));
      comm_ = nullptr;
    }
    deviceFree(send_);
    deviceFree(recv_);
    deviceFree(scratch_);
    send_ = recv_ = scratch_ = nullptr;
  }

  // Staging for `recvBytes` gathered bytes (and a send record of recvBytes / size()), grown outside graph capture.
  void ensureRecv(size_t recvBytes, Stream stream) {
    size_t record = (recvBytes + static_cast<size_t>(size_) - 1) / static_cast<size_t>(size_);
    if (record <= capacity_) return;
    KVCOMM_CHECK_ARG(!streamCapturing(stream), "publish (fallback)", "a record of ", record, " bytes exceeds the ",
                     capacity_,
                     "-byte staging and the stream is being captured: create the "
                     "Publisher with larger stagingTokens/stagingBytesPerToken");
    KVCOMM_CHECK_CU(cudaDriver().cuCtxSynchronize());  // staging may still be in use by queued work
    reserve(record);
  }

  void reserve(size_t recordBytes) {
    deviceFree(send_);
    deviceFree(recv_);
    send_ = recv_ = nullptr;
    capacity_ = 0;
    send_ = static_cast<char*>(deviceAlloc(recordBytes));
    recv_ = static_cast<char*>(deviceAlloc(recordBytes * static_cast<size_t>(size_)));
    capacity_ = recordBytes;
  }

  int size_;
  ncclComm_t comm_ = nullptr;
  char* send_ = nullptr;
  char* recv_ = nullptr;
  char* scratch_ = nullptr;
  size_t capacity_ = 0;
};

}  // namespace

std::unique_ptr<FallbackTransport> makeNcclTransport(Communicator& comm, size_t recordBytes) {
  return std::make_unique<NcclTransport>(comm, recordBytes);
}

}  // namespace kvcomm::detail
