#include "dist/collective_group.h"

#include <chrono>

namespace paraflow::dist {

namespace {

class CommunicatorGroup final : public graph::CollectiveGroup {
 public:
  explicit CommunicatorGroup(Communicator& communicator) : communicator_(communicator) {}
  int rank() const override { return communicator_.rank(); }
  int size() const override { return communicator_.size(); }
  void all_reduce_sum(const Tensor& tensor) override {
    timed(tensor, [&] { communicator_.all_reduce_sum(tensor.device_data<float>(), static_cast<size_t>(tensor.numel())); });
  }
  void all_reduce_max(const Tensor& tensor) override {
    timed(tensor, [&] { communicator_.all_reduce_max(tensor.device_data<float>(), static_cast<size_t>(tensor.numel())); });
  }
  int64_t bytes_reduced() const override { return bytes_; }
  double seconds_reducing() const override { return seconds_; }

 private:
  template <typename Reduce>
  void timed(const Tensor& tensor, Reduce reduce) {
    const auto start = std::chrono::steady_clock::now();
    reduce();
    seconds_ += std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    bytes_ += static_cast<int64_t>(tensor.nbytes());
  }

  Communicator& communicator_;
  int64_t bytes_ = 0;
  double seconds_ = 0;
};

}  // namespace

std::unique_ptr<graph::CollectiveGroup> as_collective_group(Communicator& communicator) {
  return std::make_unique<CommunicatorGroup>(communicator);
}

}  // namespace paraflow::dist
