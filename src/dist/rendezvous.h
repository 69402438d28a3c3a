// The chief serves the rendezvous store on its TF_CONFIG address; every rank (the chief too)
// reaches it through RendezvousClient, which Gloo uses as its rendezvous::Store.
#pragma once

#include <chrono>
#include <memory>
#include <string>
#include <vector>

namespace paraflow::dist {

class RendezvousServer {
 public:
  // Listens on 0.0.0.0:port; throws InputError when the port cannot be bound.
  explicit RendezvousServer(int port);
  ~RendezvousServer();

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

class RendezvousClient {
 public:
  // Waits up to `timeout` for the server at `address` to answer, else throws naming it.
  RendezvousClient(const std::string& address, std::chrono::milliseconds timeout);
  ~RendezvousClient();

  void set(const std::string& key, const std::vector<char>& value);
  // Throws naming the key and the address when it is not set within the timeout.
  std::vector<char> get(const std::string& key);

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace paraflow::dist
