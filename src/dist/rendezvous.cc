#include "dist/rendezvous.h"

#include <grpcpp/grpcpp.h>

#include <algorithm>
#include <condition_variable>
#include <map>
#include <mutex>

#include "base/error.h"
#include "dist/rendezvous.grpc.pb.h"

namespace paraflow::dist {

namespace {

class RendezvousService final : public Rendezvous::Service {
 public:
  grpc::Status Set(grpc::ServerContext*, const SetRequest* request, SetReply*) override {
    {
      std::lock_guard<std::mutex> lock(mutex_);
      if (store_.size() >= kMaxKeys && store_.count(request->key()) == 0) {
        return {grpc::StatusCode::RESOURCE_EXHAUSTED, fmt::format("rendezvous: the store holds {} keys already", kMaxKeys)};
      }
      store_[request->key()] = request->value();
    }
    changed_.notify_all();
    return grpc::Status::OK;
  }

  grpc::Status Get(grpc::ServerContext*, const GetRequest* request, GetReply* reply) override {
    std::unique_lock<std::mutex> lock(mutex_);
    // The wait comes off the wire: bounded (a value near 2^63 overflowed the clock arithmetic).
    const auto wait = std::chrono::milliseconds(std::clamp<int64_t>(request->timeout_ms(), 0, kMaxWaitMs));
    bool found = changed_.wait_for(lock, wait, [&] { return store_.count(request->key()) != 0; });
    reply->set_found(found);
    if (found) reply->set_value(store_[request->key()]);
    return grpc::Status::OK;
  }

 private:
  static constexpr size_t kMaxKeys = 1 << 20;
  static constexpr int64_t kMaxWaitMs = int64_t{24} * 3600 * 1000;
  std::mutex mutex_;
  std::condition_variable changed_;
  std::map<std::string, std::string> store_;
};

}  // namespace

struct RendezvousServer::Impl {
  RendezvousService service;
  std::unique_ptr<grpc::Server> server;
};

RendezvousServer::RendezvousServer(int port) : impl_(std::make_unique<Impl>()) {
  grpc::ServerBuilder builder;
  int bound_port = 0;
  builder.AddListeningPort("0.0.0.0:" + std::to_string(port), grpc::InsecureServerCredentials(), &bound_port);
  builder.AddChannelArgument(GRPC_ARG_ALLOW_REUSEPORT, 0);  // a port in use is an error, not shared
  builder.RegisterService(&impl_->service);
  impl_->server = builder.BuildAndStart();
  check(impl_->server != nullptr && bound_port == port, "rendezvous: cannot listen on port {} (in use?)", port);
}

RendezvousServer::~RendezvousServer() {
  impl_->server->Shutdown(std::chrono::system_clock::now() + std::chrono::seconds(1));
}

struct RendezvousClient::Impl {
  std::string address;
  std::chrono::milliseconds timeout;
  std::unique_ptr<Rendezvous::Stub> stub;
};

RendezvousClient::RendezvousClient(const std::string& address, std::chrono::milliseconds timeout)
    : impl_(std::make_unique<Impl>()) {
  impl_->address = address;
  impl_->timeout = timeout;
  auto channel = grpc::CreateChannel(address, grpc::InsecureChannelCredentials());
  if (!channel->WaitForConnected(std::chrono::system_clock::now() + timeout)) {
    fail("cannot reach the chief's rendezvous at {} within {} ms", address, timeout.count());
  }
  impl_->stub = Rendezvous::NewStub(channel);
}

RendezvousClient::~RendezvousClient() = default;

void RendezvousClient::set(const std::string& key, const std::vector<char>& value) {
  grpc::ClientContext context;
  context.set_deadline(std::chrono::system_clock::now() + impl_->timeout);
  SetRequest request;
  request.set_key(key);
  request.set_value(std::string(value.begin(), value.end()));
  SetReply reply;
  grpc::Status status = impl_->stub->Set(&context, request, &reply);
  check(status.ok(), "rendezvous at {}: set '{}' failed: {}", impl_->address, key, status.error_message());
}

std::vector<char> RendezvousClient::get(const std::string& key) {
  grpc::ClientContext context;
  context.set_deadline(std::chrono::system_clock::now() + impl_->timeout + std::chrono::seconds(5));
  GetRequest request;
  request.set_key(key);
  request.set_timeout_ms(impl_->timeout.count());
  GetReply reply;
  grpc::Status status = impl_->stub->Get(&context, request, &reply);
  check(status.ok(), "rendezvous at {}: get '{}' failed: {}", impl_->address, key, status.error_message());
  check(reply.found(), "rendezvous at {}: '{}' was not published within {} ms (a peer did not join)", impl_->address,
        key, impl_->timeout.count());
  return {reply.value().begin(), reply.value().end()};
}

}  // namespace paraflow::dist
