// Collective communication through existing engines: MPI (mpirun launches), Gloo (TF_CONFIG
// launches, bootstrapped by the chief's gRPC rendezvous) and, with one process, a local no-op.
// Calls are blocking; a Communicator is used from one thread at a time.
#pragma once

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>

#include "dist/cluster_spec.h"

namespace paraflow::dist {

class Communicator {
 public:
  virtual ~Communicator() = default;
  virtual std::string name() const = 0;
  virtual int rank() const = 0;
  virtual int size() const = 0;

  // In place: every rank ends with the element-wise sum over ranks.
  virtual void all_reduce_sum(float* data, size_t count) = 0;
  virtual void all_reduce_max(float* data, size_t count) = 0;
  // Integer sums are exact, so the result does not depend on the order of summation.
  virtual void all_reduce_sum(int64_t* data, size_t count) = 0;
  // input holds size()·count elements; this rank's output (count) is the sum of its chunk.
  virtual void reduce_scatter_sum(const float* input, float* output, size_t count) = 0;
  // input holds count elements; output (size()·count) holds every rank's input in rank order.
  virtual void all_gather(const float* input, float* output, size_t count) = 0;
  virtual void broadcast(void* data, size_t bytes, int root) = 0;
  virtual void send(const void* data, size_t bytes, int peer) = 0;
  virtual void recv(void* data, size_t bytes, int peer) = 0;
  // Sends to one peer and receives from another (or the same) at once: two ranks that each send
  // to the other this way cannot deadlock, as two blocking sends of large messages can.
  virtual void send_recv(const void* send_data, size_t send_bytes, int send_peer, void* recv_data,
                         size_t recv_bytes, int recv_peer) = 0;
  virtual void barrier() = 0;
  // A barrier that waits up to `limit` where the engine has timeouts (Gloo; MPI has none): for
  // ranks that wait while the chief alone reads or writes a checkpoint, which on slow storage
  // can outlast the timeout every other collective keeps.
  virtual void barrier_within(std::chrono::milliseconds limit) {
    (void)limit;
    barrier();
  }
  // Collective over all ranks: a communicator over the ranks that passed the same `color`,
  // ranked by `key` (ties by this rank), as MPI_Comm_split. The result must be destroyed before
  // this communicator.
  virtual std::unique_ptr<Communicator> split(int color, int key) = 0;
  // Ends every process of the job with `exit_status`, now: for an error on one rank, while the
  // others may be waiting for it in a collective (MPI_Abort; with Gloo this process exits and
  // its peers' collectives fail at once on the closed connections).
  [[noreturn]] virtual void abort_job(int exit_status) = 0;
};

// `root`'s text on every rank (its length first, then its bytes).
std::string broadcast_text(Communicator& communicator, const std::string& text, int root);

std::unique_ptr<Communicator> make_local_communicator();

// True when this process was started by mpirun (OpenMPI's environment is present).
bool launched_by_mpi();
std::unique_ptr<Communicator> make_mpi_communicator();

// Joins the training group of `spec` through Gloo's TCP transport; ranks exchange addresses
// through the chief's rendezvous. Fails after `timeout` naming the peer it could not reach.
std::unique_ptr<Communicator> make_gloo_communicator(const ClusterSpec& spec, std::chrono::milliseconds timeout);

#if PARAFLOW_HAVE_NCCL
// NCCL over device pointers (GPU `device` of this process), bootstrapped through `bootstrap`.
std::unique_ptr<Communicator> make_nccl_communicator(Communicator& bootstrap, int device);
#endif

}  // namespace paraflow::dist
