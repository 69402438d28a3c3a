#include "dist/communicator.h"

namespace paraflow::dist {

std::string broadcast_text(Communicator& communicator, const std::string& text, int root) {
  uint64_t size = text.size();
  communicator.broadcast(&size, sizeof size, root);
  std::string result = text;
  result.resize(size);
  communicator.broadcast(result.data(), size, root);
  return result;
}

}  // namespace paraflow::dist
