// Run as N processes (mpirun, or TF_CONFIG tasks): checks every collective of the communicator
// against values each rank can compute by hand, prints "collectives ok" on rank 0, exits 1 on any
// mismatch.
#include <fmt/format.h>

#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <memory>
#include <vector>

#include "dist/communicator.h"

using namespace paraflow::dist;

int main(int argc, char** argv) {
  const int expected_size = argc > 1 ? std::atoi(argv[1]) : 0;
  std::unique_ptr<Communicator> communicator;
  if (launched_by_mpi()) {
    communicator = make_mpi_communicator();
  } else {
    auto spec = ClusterSpec::from_environment();
    if (!spec) {
      fmt::print(stderr, "run under mpirun or with TF_CONFIG\n");
      return 2;
    }
    communicator = make_gloo_communicator(*spec, std::chrono::seconds(30));
  }
  const int rank = communicator->rank(), size = communicator->size();
  int failures = size == expected_size ? 0 : 1;
  if (failures) fmt::print(stderr, "rank {}: group of {} ranks, expected {}\n", rank, size, expected_size);
  auto expect = [&](bool ok, const std::string& what) {
    if (!ok) {
      fmt::print(stderr, "rank {}: {} is wrong\n", rank, what);
      ++failures;
    }
  };
  const size_t n = 1000;  // per-rank chunk size
  std::vector<float> data(n);
  for (size_t i = 0; i < n; ++i) data[i] = static_cast<float>(rank + 1) * static_cast<float>(i);
  communicator->all_reduce_sum(data.data(), n);
  float ranks_sum = static_cast<float>(size * (size + 1) / 2);
  bool ok = true;
  for (size_t i = 0; i < n; ++i) ok = ok && data[i] == ranks_sum * static_cast<float>(i);
  expect(ok, "all_reduce_sum");

  float value = static_cast<float>(rank);
  communicator->all_reduce_max(&value, 1);
  expect(value == static_cast<float>(size - 1), "all_reduce_max");

  std::vector<float> full(n * static_cast<size_t>(size)), chunk(n);
  for (size_t i = 0; i < full.size(); ++i) full[i] = static_cast<float>(i % 97) + static_cast<float>(rank);
  communicator->reduce_scatter_sum(full.data(), chunk.data(), n);
  ok = true;
  for (size_t i = 0; i < n; ++i) {
    size_t global = static_cast<size_t>(rank) * n + i;
    ok = ok && chunk[i] == static_cast<float>(size) * static_cast<float>(global % 97) + ranks_sum - static_cast<float>(size);
  }
  expect(ok, "reduce_scatter_sum");

  std::vector<float> mine(n, static_cast<float>(rank) + 0.5f), gathered(n * static_cast<size_t>(size));
  communicator->all_gather(mine.data(), gathered.data(), n);
  ok = true;
  for (size_t i = 0; i < gathered.size(); ++i) ok = ok && gathered[i] == static_cast<float>(i / n) + 0.5f;
  expect(ok, "all_gather");

  std::vector<char> message(100, static_cast<char>(rank == 0 ? 'x' : '?'));
  communicator->broadcast(message.data(), message.size(), 0);
  expect(message == std::vector<char>(100, 'x'), "broadcast");

  if (size >= 2) {
    int token = 0;
    if (rank == 0) {
      token = 1234;
      communicator->send(&token, sizeof token, 1);
    } else if (rank == 1) {
      communicator->recv(&token, sizeof token, 0);
      expect(token == 1234, "send/recv");
    }
  }
  if (size >= 2) {
    // A ring where every rank sends 4 MiB to the next while receiving from the previous: blocking
    // sends this large would wait for each other forever.
    const size_t words = 1 << 20;
    std::vector<int32_t> outgoing(words), incoming(words, -1);
    for (size_t i = 0; i < words; ++i) outgoing[i] = rank * 7 + static_cast<int32_t>(i % 1000);
    const int next = (rank + 1) % size, previous = (rank + size - 1) % size;
    communicator->send_recv(outgoing.data(), words * sizeof(int32_t), next, incoming.data(), words * sizeof(int32_t),
                            previous);
    ok = true;
    for (size_t i = 0; i < words; ++i) ok = ok && incoming[i] == previous * 7 + static_cast<int32_t>(i % 1000);
    expect(ok, "send_recv");
  }

  {
    // Two groups by parity, ranked in reverse order of the parent's ranks.
    std::unique_ptr<Communicator> group = communicator->split(rank % 2, -rank);
    const int members = (size - rank % 2 + 1) / 2;
    expect(group->size() == members, "split's group size");
    const int higher_same_parity = (size - 1 - rank) / 2;  // members ranked before this one
    expect(group->rank() == higher_same_parity, "split's rank order");
    float parent_rank = static_cast<float>(rank);
    group->all_reduce_sum(&parent_rank, 1);
    float expected = 0;
    for (int r = rank % 2; r < size; r += 2) expected += static_cast<float>(r);
    expect(parent_rank == expected, "all_reduce_sum in a split group");
    group->barrier();
  }
  communicator->barrier();
  if (rank == 0 && failures == 0) fmt::print("collectives ok on {} ranks over {}\n", size, communicator->name());
  return failures == 0 ? 0 : 1;
}
