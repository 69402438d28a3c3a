// NCCL for GPU data: the same Communicator interface over device pointers, one GPU per rank,
// bootstrapped through another communicator (MPI or Gloo) that broadcasts rank 0's NCCL id.
// Built when CMake finds CUDA and NCCL; it serves the CUDA backend, whose buffers live on the
// device. Every call synchronises its stream before returning, like the other communicators.
#include <cuda_runtime.h>
#include <nccl.h>

#include <cstdlib>

#include "base/error.h"
#include "dist/communicator.h"

namespace paraflow::dist {

namespace {

void check_cuda(cudaError_t status, const char* call) {
  if (status != cudaSuccess) throw Error(fmt::format("{} failed: {}", call, cudaGetErrorString(status)));
}

void check_nccl(ncclResult_t status, const char* call) {
  if (status != ncclSuccess) throw Error(fmt::format("{} failed: {}", call, ncclGetErrorString(status)));
}

class NcclCommunicator final : public Communicator {
 public:
  NcclCommunicator(Communicator& bootstrap, int device)
      : bootstrap_(bootstrap), rank_(bootstrap.rank()), size_(bootstrap.size()) {
    check_cuda(cudaSetDevice(device), "cudaSetDevice");
    ncclUniqueId id;
    if (rank_ == 0) check_nccl(ncclGetUniqueId(&id), "ncclGetUniqueId");
    bootstrap.broadcast(&id, sizeof id, 0);
    check_nccl(ncclCommInitRank(&comm_, size_, id, rank_), "ncclCommInitRank");
    check_cuda(cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking), "cudaStreamCreate");
  }
  // A group split from `parent` (ncclCommSplit); errors still end the job through the bootstrap.
  NcclCommunicator(Communicator& bootstrap, ncclComm_t comm) : bootstrap_(bootstrap), comm_(comm) {
    check_nccl(ncclCommUserRank(comm_, &rank_), "ncclCommUserRank");
    check_nccl(ncclCommCount(comm_, &size_), "ncclCommCount");
    check_cuda(cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking), "cudaStreamCreate");
  }
  ~NcclCommunicator() override {
    cudaStreamDestroy(stream_);
    ncclCommDestroy(comm_);
  }

  std::string name() const override { return "nccl"; }
  int rank() const override { return rank_; }
  int size() const override { return size_; }

  void all_reduce_sum(float* data, size_t count) override {
    check_nccl(ncclAllReduce(data, data, count, ncclFloat32, ncclSum, comm_, stream_), "ncclAllReduce");
    synchronize();
  }
  void all_reduce_max(float* data, size_t count) override {
    check_nccl(ncclAllReduce(data, data, count, ncclFloat32, ncclMax, comm_, stream_), "ncclAllReduce");
    synchronize();
  }
  void all_reduce_sum(int64_t* data, size_t count) override {
    check_nccl(ncclAllReduce(data, data, count, ncclInt64, ncclSum, comm_, stream_), "ncclAllReduce");
    synchronize();
  }
  void reduce_scatter_sum(const float* input, float* output, size_t count) override {
    check_nccl(ncclReduceScatter(input, output, count, ncclFloat32, ncclSum, comm_, stream_), "ncclReduceScatter");
    synchronize();
  }
  void all_gather(const float* input, float* output, size_t count) override {
    check_nccl(ncclAllGather(input, output, count, ncclFloat32, comm_, stream_), "ncclAllGather");
    synchronize();
  }
  void broadcast(void* data, size_t bytes, int root) override {
    check_nccl(ncclBroadcast(data, data, bytes, ncclUint8, root, comm_, stream_), "ncclBroadcast");
    synchronize();
  }
  void send(const void* data, size_t bytes, int peer) override {
    check_nccl(ncclSend(data, bytes, ncclUint8, peer, comm_, stream_), "ncclSend");
    synchronize();
  }
  void recv(void* data, size_t bytes, int peer) override {
    check_nccl(ncclRecv(data, bytes, ncclUint8, peer, comm_, stream_), "ncclRecv");
    synchronize();
  }
  void send_recv(const void* send_data, size_t send_bytes, int send_peer, void* recv_data, size_t recv_bytes,
                 int recv_peer) override {
    check_nccl(ncclGroupStart(), "ncclGroupStart");
    check_nccl(ncclSend(send_data, send_bytes, ncclUint8, send_peer, comm_, stream_), "ncclSend");
    check_nccl(ncclRecv(recv_data, recv_bytes, ncclUint8, recv_peer, comm_, stream_), "ncclRecv");
    check_nccl(ncclGroupEnd(), "ncclGroupEnd");
    synchronize();
  }
  std::unique_ptr<Communicator> split(int color, int key) override {
    ncclComm_t group = nullptr;
    check_nccl(ncclCommSplit(comm_, color, key, &group, nullptr), "ncclCommSplit");
    return std::make_unique<NcclCommunicator>(bootstrap_, group);
  }
  void barrier() override {
    // NCCL has no barrier: an all-reduce of one device float is one.
    float* flag = nullptr;
    check_cuda(cudaMalloc(&flag, sizeof(float)), "cudaMalloc");
    check_nccl(ncclAllReduce(flag, flag, 1, ncclFloat32, ncclSum, comm_, stream_), "ncclAllReduce");
    synchronize();
    cudaFree(flag);
  }
  [[noreturn]] void abort_job(int exit_status) override {
    ncclCommAbort(comm_);  // frees this rank's kernels; the bootstrap ends the processes
    bootstrap_.abort_job(exit_status);
    std::_Exit(exit_status);  // not reached: abort_job does not return
  }

 private:
  void synchronize() { check_cuda(cudaStreamSynchronize(stream_), "cudaStreamSynchronize"); }

  Communicator& bootstrap_;
  int rank_ = 0, size_ = 1;
  ncclComm_t comm_ = nullptr;
  cudaStream_t stream_ = nullptr;
};

}  // namespace

std::unique_ptr<Communicator> make_nccl_communicator(Communicator& bootstrap, int device) {
  return std::make_unique<NcclCommunicator>(bootstrap, device);
}

}  // namespace paraflow::dist
