// How the tasks of a parameter-server job reach each other over gRPC: optional TLS (gRPC's own)
// and an optional shared token sent as `authorization: Bearer <token>` with every call, so a
// stranger on the network can neither pull the weights nor push gradients. Servers listen on
// their TF_CONFIG address only, never on every interface.
#pragma once

#include <grpcpp/grpcpp.h>

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <future>
#include <mutex>
#include <memory>
#include <string>
#include <vector>

#include "base/error.h"

namespace paraflow::ps {

struct ChannelSecurity {
  std::string certificate, private_key, root_certificates;  // PEM text; empty: no TLS
  std::string token;                                         // empty: no token

  // Reads the PEM files and the token file (any of them may be empty), naming the config key of
  // a file that cannot be read or is empty. TLS needs a certificate and its key; clients trust
  // `ca_file`, or the certificate itself when it is self-signed and no CA is given.
  static ChannelSecurity from_files(const std::string& certificate_file, const std::string& key_file,
                                    const std::string& ca_file, const std::string& token_file);
  bool tls() const { return !certificate.empty(); }
  std::string describe() const;

  std::shared_ptr<grpc::ServerCredentials> server_credentials() const;
  std::shared_ptr<grpc::ChannelCredentials> channel_credentials() const;
  // UNAUTHENTICATED unless the call carries the token (constant-time comparison).
  grpc::Status authenticate(const grpc::ServerContext& context) const;
  void authorize(grpc::ClientContext& context) const;
};

// A failed call to another task: the peer named, the gRPC status kept for the caller to decide
// (a dead peer is UNAVAILABLE or DEADLINE_EXCEEDED).
class PeerError : public Error {
 public:
  PeerError(const std::string& message, grpc::StatusCode code) : Error(message), code_(code) {}
  grpc::StatusCode code() const { return code_; }
  bool unreachable() const {
    return code_ == grpc::StatusCode::UNAVAILABLE || code_ == grpc::StatusCode::DEADLINE_EXCEEDED;
  }

 private:
  grpc::StatusCode code_;
};

// Set by a Shutdown call; a task's serve() waits on it.
class ShutdownLatch {
 public:
  void request();
  // Until request(). After *stop becomes true (SIGTERM: Kubernetes stops every pod of a job at
  // once), for at most `grace` more, so the chief can still take its last snapshot.
  void wait(const std::atomic<bool>* stop, std::chrono::milliseconds grace);

 private:
  std::mutex mutex_;
  std::condition_variable requested_;
  bool shutdown_ = false;
};

// Messages up to `max_message_bytes` each way (ps/wire.h: a chunk of a shard and its fields).
std::shared_ptr<grpc::Channel> open_channel(const std::string& address, const ChannelSecurity& security,
                                            int64_t max_message_bytes);
// Listens on `address` (host:port from TF_CONFIG; port 0 picks a free one, returned in *port);
// throws naming it when it cannot be bound.
std::unique_ptr<grpc::Server> start_server(const std::string& address, const ChannelSecurity& security,
                                           int64_t max_message_bytes, const std::vector<grpc::Service*>& services,
                                           int* port = nullptr);

// How messages name task `index` of `job` at `address`: "ps 1 (127.0.0.1:2223)".
inline std::string peer_name(const char* job, size_t index, const std::string& address) {
  return fmt::format("{} {} ({})", job, index, address);
}

// Every task of a job must read one TF_CONFIG cluster (a task that lists other workers would
// split the batch otherwise). "" when `theirs` (task `peer`'s) is `chief` (the chief's) or either
// is unknown (""), else the refusal naming the task and both clusters.
inline std::string cluster_difference(const std::string& peer, const std::string& theirs, const std::string& chief) {
  if (theirs.empty() || chief.empty() || theirs == chief) return "";
  return fmt::format("TF_CONFIG differs between tasks: {} has the cluster {}, the chief {}; every task needs the "
                     "same cluster", peer, theirs, chief);
}

// One unary call to `peer` (e.g. "ps 1 (127.0.0.1:2223)") within `deadline`; throws PeerError
// naming the peer and the method. A peer that is not listening fails the call at once, unless
// `wait_for_ready`: then the call waits for it (within the deadline) to come up.
template <typename Stub, typename Request, typename Reply>
Reply call_peer(const std::string& peer, const char* method, Stub& stub,
                grpc::Status (Stub::*rpc)(grpc::ClientContext*, const Request&, Reply*), const Request& request,
                std::chrono::milliseconds deadline, const ChannelSecurity& security, bool wait_for_ready = false) {
  grpc::ClientContext context;
  context.set_deadline(std::chrono::system_clock::now() + deadline);
  context.set_wait_for_ready(wait_for_ready);
  security.authorize(context);
  Reply reply;
  const grpc::Status status = (stub.*rpc)(&context, request, &reply);
  if (!status.ok()) {
    throw PeerError(fmt::format("{}: {} failed: {} ({})", peer, method, status.error_message(),
                                static_cast<int>(status.error_code())),
                    status.error_code());
  }
  return reply;
}

// Runs `call(task)` for tasks 0..count-1 at once (one thread each: a call mostly waits on the
// network) and returns the results in task order; rethrows the first task's failure.
template <typename Call>
auto for_each_task(size_t count, Call call) {
  using Result = decltype(call(size_t{0}));
  std::vector<std::future<Result>> pending;
  for (size_t task = 0; task < count; ++task) pending.push_back(std::async(std::launch::async, call, task));
  std::vector<Result> results;
  for (auto& result : pending) results.push_back(result.get());
  return results;
}

// Sends `request` through `rpc` (a Shutdown) to every task of `stubs` (named by `names`), all at
// once. A task that does not answer is left alone: at once (it has died), or, with
// `wait_for_starting`, after waiting up to `timeout` for it to come up (a chief that fails at
// start may fail before every task is listening).
template <typename Stub, typename Request, typename Reply>
void shut_down_tasks(const std::vector<std::string>& names, const std::vector<std::unique_ptr<Stub>>& stubs,
                     grpc::Status (Stub::*rpc)(grpc::ClientContext*, const Request&, Reply*), const Request& request,
                     bool wait_for_starting, std::chrono::milliseconds timeout, const ChannelSecurity& security) {
  const std::chrono::milliseconds deadline = wait_for_starting ? timeout : std::chrono::milliseconds(2000);
  for_each_task(stubs.size(), [&](size_t task) {
    try {
      call_peer(names[task], "Shutdown", *stubs[task], rpc, request, deadline, security, wait_for_starting);
    } catch (const PeerError&) {
    }
    return true;
  });
}

}  // namespace paraflow::ps
