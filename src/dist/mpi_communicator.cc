#include <mpi.h>

#include <climits>
#include <cstdio>
#include <cstdlib>

#include "base/error.h"
#include "dist/communicator.h"

namespace paraflow::dist {

namespace {

void check_mpi(int status, const char* call) {
  if (status != MPI_SUCCESS) {
    char message[MPI_MAX_ERROR_STRING];
    int length = 0;
    MPI_Error_string(status, message, &length);
    throw Error(fmt::format("{} failed: {}", call, std::string(message, static_cast<size_t>(length))));
  }
}

int as_count(size_t count) {
  if (count > static_cast<size_t>(INT_MAX)) throw Error(fmt::format("MPI message of {} elements is too large", count));
  return static_cast<int>(count);
}

class MpiCommunicator final : public Communicator {
 public:
  MpiCommunicator() : communicator_(MPI_COMM_WORLD), owns_mpi_(true) {
    int initialized = 0;
    MPI_Initialized(&initialized);
    if (!initialized) {
      int provided = 0;
      // Collectives run on the gradient thread while the main thread computes: SERIALIZED
      // suffices (one thread calls MPI at a time), MULTIPLE is welcome.
      check_mpi(MPI_Init_thread(nullptr, nullptr, MPI_THREAD_SERIALIZED, &provided), "MPI_Init_thread");
      if (provided < MPI_THREAD_SERIALIZED) throw Error("this MPI library does not support MPI_THREAD_SERIALIZED");
    }
    MPI_Comm_set_errhandler(MPI_COMM_WORLD, MPI_ERRORS_RETURN);
    MPI_Comm_rank(MPI_COMM_WORLD, &rank_);
    MPI_Comm_size(MPI_COMM_WORLD, &size_);
  }
  // A group split from another; it frees its MPI communicator, the world one finalizes MPI.
  explicit MpiCommunicator(MPI_Comm group) : communicator_(group), owns_mpi_(false) {
    MPI_Comm_set_errhandler(group, MPI_ERRORS_RETURN);
    MPI_Comm_rank(group, &rank_);
    MPI_Comm_size(group, &size_);
  }
  ~MpiCommunicator() override {
    int finalized = 0;
    MPI_Finalized(&finalized);
    if (finalized) return;
    if (owns_mpi_) {
      MPI_Finalize();
    } else {
      MPI_Comm_free(&communicator_);
    }
  }

  std::string name() const override { return "mpi"; }
  int rank() const override { return rank_; }
  int size() const override { return size_; }

  void all_reduce_sum(float* data, size_t count) override {
    check_mpi(MPI_Allreduce(MPI_IN_PLACE, data, as_count(count), MPI_FLOAT, MPI_SUM, communicator_), "MPI_Allreduce");
  }
  void all_reduce_max(float* data, size_t count) override {
    check_mpi(MPI_Allreduce(MPI_IN_PLACE, data, as_count(count), MPI_FLOAT, MPI_MAX, communicator_), "MPI_Allreduce");
  }
  void all_reduce_sum(int64_t* data, size_t count) override {
    check_mpi(MPI_Allreduce(MPI_IN_PLACE, data, as_count(count), MPI_INT64_T, MPI_SUM, communicator_), "MPI_Allreduce");
  }
  void reduce_scatter_sum(const float* input, float* output, size_t count) override {
    check_mpi(MPI_Reduce_scatter_block(input, output, as_count(count), MPI_FLOAT, MPI_SUM, communicator_),
              "MPI_Reduce_scatter_block");
  }
  void all_gather(const float* input, float* output, size_t count) override {
    check_mpi(MPI_Allgather(input, as_count(count), MPI_FLOAT, output, as_count(count), MPI_FLOAT, communicator_),
              "MPI_Allgather");
  }
  void broadcast(void* data, size_t bytes, int root) override {
    check_mpi(MPI_Bcast(data, as_count(bytes), MPI_BYTE, root, communicator_), "MPI_Bcast");
  }
  void send(const void* data, size_t bytes, int peer) override {
    check_mpi(MPI_Send(data, as_count(bytes), MPI_BYTE, peer, 0, communicator_), "MPI_Send");
  }
  void recv(void* data, size_t bytes, int peer) override {
    check_mpi(MPI_Recv(data, as_count(bytes), MPI_BYTE, peer, 0, communicator_, MPI_STATUS_IGNORE), "MPI_Recv");
  }
  void send_recv(const void* send_data, size_t send_bytes, int send_peer, void* recv_data, size_t recv_bytes,
                 int recv_peer) override {
    check_mpi(MPI_Sendrecv(send_data, as_count(send_bytes), MPI_BYTE, send_peer, 0, recv_data, as_count(recv_bytes),
                           MPI_BYTE, recv_peer, 0, communicator_, MPI_STATUS_IGNORE),
              "MPI_Sendrecv");
  }
  std::unique_ptr<Communicator> split(int color, int key) override {
    MPI_Comm group = MPI_COMM_NULL;
    check_mpi(MPI_Comm_split(communicator_, color, key, &group), "MPI_Comm_split");
    return std::make_unique<MpiCommunicator>(group);
  }
  void barrier() override { check_mpi(MPI_Barrier(communicator_), "MPI_Barrier"); }
  [[noreturn]] void abort_job(int exit_status) override {
    std::fflush(stderr);
    MPI_Abort(MPI_COMM_WORLD, exit_status);
    std::_Exit(exit_status);  // MPI_Abort does not return; this satisfies [[noreturn]]
  }

 private:
  MPI_Comm communicator_;
  bool owns_mpi_;
  int rank_ = 0, size_ = 1;
};

}  // namespace

bool launched_by_mpi() {
  return std::getenv("OMPI_COMM_WORLD_SIZE") != nullptr || std::getenv("PMI_SIZE") != nullptr ||
         std::getenv("PMIX_RANK") != nullptr;
}

std::unique_ptr<Communicator> make_mpi_communicator() { return std::make_unique<MpiCommunicator>(); }

}  // namespace paraflow::dist
