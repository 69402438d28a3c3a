#include <cstdlib>
#include <cstring>

#include "base/error.h"
#include "dist/communicator.h"

namespace paraflow::dist {

namespace {

// One process: every collective is the identity.
class LocalCommunicator final : public Communicator {
 public:
  std::string name() const override { return "local"; }
  int rank() const override { return 0; }
  int size() const override { return 1; }
  void all_reduce_sum(float*, size_t) override {}
  void all_reduce_max(float*, size_t) override {}
  void all_reduce_sum(int64_t*, size_t) override {}
  void reduce_scatter_sum(const float* input, float* output, size_t count) override {
    if (input != output) std::memmove(output, input, count * sizeof(float));
  }
  void all_gather(const float* input, float* output, size_t count) override {
    if (input != output) std::memmove(output, input, count * sizeof(float));
  }
  void broadcast(void*, size_t, int) override {}
  void send(const void*, size_t, int peer) override { throw Error(fmt::format("send to rank {} with one process", peer)); }
  void recv(void*, size_t, int peer) override { throw Error(fmt::format("recv from rank {} with one process", peer)); }
  void send_recv(const void*, size_t, int send_peer, void*, size_t, int) override {
    throw Error(fmt::format("send to rank {} with one process", send_peer));
  }
  void barrier() override {}
  std::unique_ptr<Communicator> split(int, int) override { return std::make_unique<LocalCommunicator>(); }
  [[noreturn]] void abort_job(int exit_status) override { std::_Exit(exit_status); }
};

}  // namespace

std::unique_ptr<Communicator> make_local_communicator() { return std::make_unique<LocalCommunicator>(); }

}  // namespace paraflow::dist
