#include "dist/collective_group.h"

namespace paraflow::dist {

namespace {

class CommunicatorGroup final : public graph::CollectiveGroup {
 public:
  explicit CommunicatorGroup(Communicator& communicator) : communicator_(communicator) {}
  int rank() const override { return communicator_.rank(); }
  int size() const override { return communicator_.size(); }
  void all_reduce_sum(const Tensor& tensor) override {
    communicator_.all_reduce_sum(tensor.device_data<float>(), static_cast<size_t>(tensor.numel()));
  }
  void all_reduce_max(const Tensor& tensor) override {
    communicator_.all_reduce_max(tensor.device_data<float>(), static_cast<size_t>(tensor.numel()));
  }

 private:
  Communicator& communicator_;
};

}  // namespace

std::unique_ptr<graph::CollectiveGroup> as_collective_group(Communicator& communicator) {
  return std::make_unique<CommunicatorGroup>(communicator);
}

}  // namespace paraflow::dist
