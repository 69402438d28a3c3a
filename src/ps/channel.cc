#include "ps/channel.h"

#include <algorithm>
#include <climits>

#include "base/file_io.h"

namespace paraflow::ps {

namespace {

std::string read_setting_file(const std::string& path, const char* key) {
  if (path.empty()) return {};
  std::string text;
  try {
    text = read_file(path);
  } catch (const Error& e) {
    fail("{} '{}': {}", key, path, e.what());
  }
  check(!text.empty(), "{} '{}' is empty", key, path);
  return text;
}

}  // namespace

ChannelSecurity ChannelSecurity::from_files(const std::string& certificate_file, const std::string& key_file,
                                            const std::string& ca_file, const std::string& token_file) {
  ChannelSecurity security;
  check(certificate_file.empty() == key_file.empty(), "dist.tls_cert and dist.tls_key go together (one is unset)");
  check(ca_file.empty() || !certificate_file.empty(), "dist.tls_ca is set but dist.tls_cert is not");
  security.certificate = read_setting_file(certificate_file, "dist.tls_cert");
  security.private_key = read_setting_file(key_file, "dist.tls_key");
  security.root_certificates = ca_file.empty() ? security.certificate : read_setting_file(ca_file, "dist.tls_ca");
  security.token = read_setting_file(token_file, "dist.auth_token_file");
  // A trailing newline from `echo token > file` is not part of the token.
  while (!security.token.empty() && (security.token.back() == '\n' || security.token.back() == '\r')) {
    security.token.pop_back();
  }
  check(token_file.empty() || !security.token.empty(), "dist.auth_token_file '{}' holds only a newline", token_file);
  return security;
}

std::string ChannelSecurity::describe() const {
  return fmt::format("{}, {}", tls() ? "TLS" : "plaintext", token.empty() ? "no token" : "token required");
}

std::shared_ptr<grpc::ServerCredentials> ChannelSecurity::server_credentials() const {
  if (!tls()) return grpc::InsecureServerCredentials();
  grpc::SslServerCredentialsOptions options;
  options.pem_key_cert_pairs.push_back({private_key, certificate});
  return grpc::SslServerCredentials(options);
}

std::shared_ptr<grpc::ChannelCredentials> ChannelSecurity::channel_credentials() const {
  if (!tls()) return grpc::InsecureChannelCredentials();
  grpc::SslCredentialsOptions options;
  options.pem_root_certs = root_certificates;
  return grpc::SslCredentials(options);
}

grpc::Status ChannelSecurity::authenticate(const grpc::ServerContext& context) const {
  if (token.empty()) return grpc::Status::OK;
  const std::string expected = "Bearer " + token;
  auto found = context.client_metadata().find("authorization");
  bool same = false;
  if (found != context.client_metadata().end() && found->second.size() == expected.size()) {
    unsigned char difference = 0;
    for (size_t i = 0; i < expected.size(); ++i) difference |= static_cast<unsigned char>(found->second.data()[i] ^ expected[i]);
    same = difference == 0;
  }
  return same ? grpc::Status::OK
              : grpc::Status(grpc::StatusCode::UNAUTHENTICATED, "missing or wrong token (dist.auth_token_file)");
}

void ChannelSecurity::authorize(grpc::ClientContext& context) const {
  if (!token.empty()) context.AddMetadata("authorization", "Bearer " + token);
}

namespace {

int message_limit(int64_t bytes) { return static_cast<int>(std::min<int64_t>(bytes, INT32_MAX)); }

}  // namespace

void ShutdownLatch::request() {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    shutdown_ = true;
  }
  requested_.notify_all();
}

void ShutdownLatch::wait(const std::atomic<bool>* stop, std::chrono::milliseconds grace) {
  std::unique_lock<std::mutex> lock(mutex_);
  while (!shutdown_ && !(stop && stop->load())) requested_.wait_for(lock, std::chrono::milliseconds(100));
  requested_.wait_for(lock, grace, [&] { return shutdown_; });
}

std::shared_ptr<grpc::Channel> open_channel(const std::string& address, const ChannelSecurity& security,
                                            int64_t max_message_bytes) {
  grpc::ChannelArguments arguments;
  arguments.SetMaxReceiveMessageSize(message_limit(max_message_bytes));
  arguments.SetMaxSendMessageSize(message_limit(max_message_bytes));
  // Try again soon for a peer that comes back (a restarted ps or worker). gRPC's minimum backoff
  // is also each attempt's connect timeout: left at its default (20 s), or a busy peer's
  // handshake would never finish in time.
  arguments.SetInt(GRPC_ARG_MAX_RECONNECT_BACKOFF_MS, 1000);
  arguments.SetInt(GRPC_ARG_INITIAL_RECONNECT_BACKOFF_MS, 100);
  return grpc::CreateCustomChannel(address, security.channel_credentials(), arguments);
}

std::unique_ptr<grpc::Server> start_server(const std::string& address, const ChannelSecurity& security,
                                           int64_t max_message_bytes, const std::vector<grpc::Service*>& services,
                                           int* port) {
  grpc::ServerBuilder builder;
  int bound_port = 0;
  builder.AddListeningPort(address, security.server_credentials(), &bound_port);
  builder.SetMaxReceiveMessageSize(message_limit(max_message_bytes));
  builder.SetMaxSendMessageSize(message_limit(max_message_bytes));
  // gRPC shares a port with SO_REUSEPORT by default: a second copy of a task would silently take
  // half the connections. A port in use is an error.
  builder.AddChannelArgument(GRPC_ARG_ALLOW_REUSEPORT, 0);
  for (grpc::Service* service : services) builder.RegisterService(service);
  std::unique_ptr<grpc::Server> server = builder.BuildAndStart();
  check(server != nullptr && bound_port != 0, "cannot listen on {} (the TF_CONFIG address of this task): in use, or "
        "not an address of this host?", address);
  if (port) *port = bound_port;
  return server;
}

}  // namespace paraflow::ps
