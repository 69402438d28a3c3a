// A ps task's gRPC service in this process, called through its stubs: the synchronous and
// asynchronous updates against AdamW worked out in double precision, the refusals, oversized
// and fuzzed messages, the token and TLS.
#include <gtest/gtest.h>

#include <grpcpp/generic/generic_stub.h>

#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cmath>
#include <future>
#include <map>
#include <optional>
#include <random>
#include <thread>

#include "base/file_io.h"
#include "ps/parameter_server.grpc.pb.h"
#include "ps/parameter_server.h"
#include "ps/wire.h"
#include "ps/worker.h"
#include "train/token_source.h"
#include "reference_runner.h"

namespace paraflow::ps {
namespace {

constexpr uint64_t kGeneration = 7;
const std::vector<float> kParameters = {0.5f, -1.0f, 2.0f, 0.25f, -0.75f};
constexpr double kBeta1 = 0.9, kBeta2 = 0.95, kEps = 1e-8, kDecay = 0.1;

// torch.optim.AdamW's step, in double: decay, then the bias-corrected Adam step.
struct ReferenceAdamW {
  std::vector<double> p, m, v;
  int t = 0;
  explicit ReferenceAdamW(const std::vector<float>& start) : p(start.begin(), start.end()), m(p.size()), v(p.size()) {}
  void step(const std::vector<double>& g, double lr, const std::vector<bool>& decays) {
    ++t;
    for (size_t i = 0; i < p.size(); ++i) {
      m[i] = kBeta1 * m[i] + (1 - kBeta1) * g[i];
      v[i] = kBeta2 * v[i] + (1 - kBeta2) * g[i] * g[i];
      const double m_hat = m[i] / (1 - std::pow(kBeta1, t)), v_hat = v[i] / (1 - std::pow(kBeta2, t));
      p[i] = p[i] * (1 - lr * (decays[i] ? kDecay : 0)) - lr * m_hat / (std::sqrt(v_hat) + kEps);
    }
  }
};
// Piece "a" (3 values, decayed) and "b" (2, not decayed).
const std::vector<bool> kDecays = {true, true, true, false, false};

class ParameterServerTest : public ::testing::Test {
 protected:
  void start(const ChannelSecurity& security = {}, int64_t max_message_bytes = 1 << 20) {
    server = std::make_unique<ParameterServerTask>("127.0.0.1:0", security, max_message_bytes, cpu_backend());
    address = "127.0.0.1:" + std::to_string(server->port());
    channel = open_channel(address, security, 64 << 20);
    stub = ParameterServer::NewStub(channel);
    caller = security;
  }

  template <typename Request, typename Reply>
  grpc::Status call(grpc::Status (ParameterServer::Stub::*rpc)(grpc::ClientContext*, const Request&, Reply*),
                    const Request& request, Reply* reply) {
    grpc::ClientContext context;
    context.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(10));
    caller.authorize(context);
    return (stub.get()->*rpc)(&context, request, reply);
  }

  static LoadRequest load_request(bool synchronous, int slices, int64_t max_staleness) {
    LoadRequest request;
    request.set_generation(kGeneration);
    for (auto [name, offset, count, decay] : {std::tuple{"a", 0, 3, true}, std::tuple{"b", 3, 2, false}}) {
      PieceSpec* piece = request.add_pieces();
      piece->set_tensor(name);
      piece->set_offset(offset);
      piece->set_count(count);
      piece->set_weight_decay(decay);
    }
    request.mutable_optimizer()->set_beta1(kBeta1);
    request.mutable_optimizer()->set_beta2(kBeta2);
    request.mutable_optimizer()->set_eps(kEps);
    request.mutable_optimizer()->set_weight_decay(kDecay);
    request.set_synchronous(synchronous);
    request.set_slices(slices);
    request.set_max_staleness(max_staleness);
    return request;
  }

  // Elements [first, first + values.size()) of one field of piece `piece`.
  grpc::Status fill(int piece, Field field, int64_t first, const std::vector<float>& values) {
    FillRequest request;
    request.set_generation(kGeneration);
    request.set_piece(piece);
    request.set_field(field);
    request.set_offset(first);
    request.set_values(to_bytes(values.data(), static_cast<int64_t>(values.size())));
    FillReply filled;
    return call(&ParameterServer::Stub::Fill, request, &filled);
  }

  // Loaded with kParameters and zero moments.
  void load(bool synchronous, int slices = 1, int64_t max_staleness = 0) {
    LoadReply reply;
    ASSERT_TRUE(call(&ParameterServer::Stub::Load, load_request(synchronous, slices, max_staleness), &reply).ok());
    for (auto [piece, first, count] : {std::tuple{0, 0, 3}, std::tuple{1, 3, 2}}) {
      ASSERT_TRUE(fill(piece, PARAMETERS, 0, {kParameters.begin() + first, kParameters.begin() + first + count}).ok());
      for (Field moment : {FIRST_MOMENT, SECOND_MOMENT}) {
        ASSERT_TRUE(fill(piece, moment, 0, std::vector<float>(static_cast<size_t>(count))).ok());
      }
    }
  }

  SnapshotRequest snapshot_request(int piece, Field field, int64_t first, int64_t count) {
    SnapshotRequest request;
    request.set_generation(kGeneration);
    request.set_piece(piece);
    request.set_field(field);
    request.set_offset(first);
    request.set_count(count);
    return request;
  }

  // One field of the whole shard (pieces "a" and "b"), a piece a call.
  std::vector<float> snapshot(Field field, int64_t* optimizer_steps = nullptr) {
    std::vector<float> values;
    for (auto [piece, count] : {std::pair{0, 3}, std::pair{1, 2}}) {
      SnapshotReply reply;
      EXPECT_TRUE(call(&ParameterServer::Stub::Snapshot, snapshot_request(piece, field, 0, count), &reply).ok());
      std::vector<float> part(static_cast<size_t>(count));
      from_bytes(reply.values(), part.data(), count, "snapshot");
      values.insert(values.end(), part.begin(), part.end());
      if (optimizer_steps) *optimizer_steps = reply.optimizer_steps();
    }
    return values;
  }

  PushRequest push_request(const std::vector<float>& gradients, int64_t version, int slice, int64_t closure = 0,
                           double lr = 0, float grad_scale = 1) {
    PushRequest request;
    request.set_generation(kGeneration);
    request.set_version(version);
    request.set_slice(slice);
    request.set_closure(closure);
    request.set_lr(lr);
    request.set_grad_scale(grad_scale);
    request.set_gradients(to_bytes(gradients.data(), static_cast<int64_t>(gradients.size())));
    return request;
  }

  // A Pull of elements [offset, offset + count) of the shard as of `version` (-1: the newest).
  static PullRequest pull_request(int64_t version, int64_t count = 0, int64_t offset = 0) {
    PullRequest request;
    request.set_generation(kGeneration);
    request.set_version(version);
    request.set_offset(offset);
    request.set_count(count);
    return request;
  }

  std::vector<float> pull(int64_t version = -1) {
    PullReply reply;
    EXPECT_TRUE(call(&ParameterServer::Stub::Pull, pull_request(version, 5), &reply).ok());
    std::vector<float> values(kParameters.size());
    from_bytes(reply.parameters(), values.data(), 5, "pull");
    return values;
  }

  StatusReply status() {
    StatusReply reply;
    EXPECT_TRUE(call(&ParameterServer::Stub::Status, StatusRequest(), &reply).ok());
    return reply;
  }

  static void expect_near(const std::vector<float>& actual, const std::vector<double>& expected) {
    ASSERT_EQ(actual.size(), expected.size());
    for (size_t i = 0; i < actual.size(); ++i) EXPECT_NEAR(actual[i], expected[i], 1e-6 * (1 + std::abs(expected[i]))) << i;
  }

  std::unique_ptr<ParameterServerTask> server;
  std::string address;
  std::shared_ptr<grpc::Channel> channel;
  std::unique_ptr<ParameterServer::Stub> stub;
  ChannelSecurity caller;
};

const std::vector<float> kSlice0 = {0.1f, -0.2f, 0.3f, 0.4f, -0.5f};
const std::vector<float> kSlice1 = {0.05f, 0.1f, -0.1f, 0.2f, 0.3f};

TEST_F(ParameterServerTest, SynchronousStepSumsTheSlicesAndAppliesAdamW) {
  start();
  load(true, 2);
  PushReply pushed;
  // Slices arrive in any order; slice 1 twice (a rescheduled step's repeat).
  ASSERT_TRUE(call(&ParameterServer::Stub::Push, push_request(kSlice1, 0, 1), &pushed).ok());
  ASSERT_TRUE(call(&ParameterServer::Stub::Push, push_request(kSlice1, 0, 1), &pushed).ok());
  ASSERT_TRUE(call(&ParameterServer::Stub::Push, push_request(kSlice0, 0, 0), &pushed).ok());
  ReduceRequest reduce;
  reduce.set_generation(kGeneration);
  reduce.set_version(0);
  ReduceReply reduced;
  ASSERT_TRUE(call(&ParameterServer::Stub::Reduce, reduce, &reduced).ok());
  std::vector<double> sum(5);
  double squares = 0;
  for (size_t i = 0; i < 5; ++i) {
    sum[i] = double(kSlice0[i]) + double(kSlice1[i]);
    squares += sum[i] * sum[i];
  }
  EXPECT_NEAR(reduced.squares(), squares, 1e-6 * squares);

  ApplyRequest apply;
  apply.set_generation(kGeneration);
  apply.set_version(0);
  apply.set_lr(0.01);
  apply.set_grad_scale(0.5f);
  ApplyReply applied;
  ASSERT_TRUE(call(&ParameterServer::Stub::Apply, apply, &applied).ok());
  EXPECT_EQ(applied.version(), 1);
  ReferenceAdamW reference(kParameters);
  std::vector<double> scaled = sum;
  for (double& g : scaled) g *= 0.5;
  reference.step(scaled, 0.01, kDecays);
  expect_near(pull(1), reference.p);

  // The same Apply again (its answer lost): nothing changes.
  ASSERT_TRUE(call(&ParameterServer::Stub::Apply, apply, &applied).ok());
  EXPECT_EQ(status().version(), 1);
  expect_near(pull(), reference.p);

  // A pull of a chunk: elements [1, 4).
  PullRequest chunk_pull = pull_request(1, 3, 1);
  PullReply chunk_pulled;
  ASSERT_TRUE(call(&ParameterServer::Stub::Pull, chunk_pull, &chunk_pulled).ok());
  std::vector<float> middle(3);
  from_bytes(chunk_pulled.parameters(), middle.data(), 3, "pull");
  expect_near(middle, {reference.p[1], reference.p[2], reference.p[3]});
  chunk_pull.set_offset(4);
  EXPECT_EQ(call(&ParameterServer::Stub::Pull, chunk_pull, &chunk_pulled).error_code(), grpc::StatusCode::INVALID_ARGUMENT)
      << "elements [4, 7) of 5";

  // A second step, its slices pushed in chunks, then the moments and step count in the snapshot.
  auto push_chunk = [&](int slice, int64_t first, int64_t count) {
    PushRequest request = push_request(std::vector<float>(kSlice0.begin() + first, kSlice0.begin() + first + count), 1, slice);
    request.set_offset(first);
    return call(&ParameterServer::Stub::Push, request, &pushed);
  };
  ASSERT_TRUE(push_chunk(0, 0, 2).ok());
  ASSERT_TRUE(push_chunk(0, 2, 3).ok());
  ASSERT_TRUE(push_chunk(1, 0, 3).ok());
  grpc::Status skipped = push_chunk(1, 4, 1);
  EXPECT_EQ(skipped.error_code(), grpc::StatusCode::FAILED_PRECONDITION) << "element 3 not pushed yet";
  EXPECT_NE(skipped.error_message().find("next chunk starts at 3"), std::string::npos) << skipped.error_message();
  ASSERT_TRUE(push_chunk(1, 0, 3).ok()) << "a rescheduled slice starts again";
  ASSERT_TRUE(push_chunk(1, 3, 2).ok());
  ASSERT_TRUE(push_chunk(1, 0, 1).ok()) << "a complete slice ignores a late repeat";
  reduce.set_version(1);
  ASSERT_TRUE(call(&ParameterServer::Stub::Reduce, reduce, &reduced).ok());
  apply.set_version(1);
  apply.set_grad_scale(1.0f);
  ASSERT_TRUE(call(&ParameterServer::Stub::Apply, apply, &applied).ok());
  std::vector<double> twice(5);
  for (size_t i = 0; i < 5; ++i) twice[i] = 2.0 * kSlice0[i];
  reference.step(twice, 0.01, kDecays);
  int64_t optimizer_steps = 0;
  expect_near(snapshot(PARAMETERS, &optimizer_steps), reference.p);
  EXPECT_EQ(optimizer_steps, 2);
  expect_near(snapshot(FIRST_MOMENT), reference.m);
  expect_near(snapshot(SECOND_MOMENT), reference.v);
}

// The chief's load: a shard answers nothing until each of its pieces' three fields is filled, a
// chunk at a time, in order; a snapshot returns a chunk of one field of one piece.
TEST_F(ParameterServerTest, AShardIsFilledAndSnapshottedAChunkAtATime) {
  start();
  LoadReply loaded;
  ASSERT_TRUE(call(&ParameterServer::Stub::Load, load_request(true, 1, 0), &loaded).ok());
  const PullRequest newest = pull_request(-1, 5);
  PullReply pulled;
  grpc::Status refused = call(&ParameterServer::Stub::Pull, newest, &pulled);
  EXPECT_EQ(refused.error_code(), grpc::StatusCode::FAILED_PRECONDITION);
  EXPECT_NE(refused.error_message().find("2 of this shard's 2 pieces are not filled yet"), std::string::npos)
      << refused.error_message();
  // Piece "b" (2 values): values 3.. of kParameters, moments 10x and 100x them, a value a chunk.
  auto fill_piece = [&](int piece, int64_t first, int64_t count) {
    for (auto [field, factor] : {std::pair{PARAMETERS, 1.0f}, {FIRST_MOMENT, 10.0f}, {SECOND_MOMENT, 100.0f}}) {
      for (int64_t i = 0; i < count; ++i) {
        ASSERT_TRUE(fill(piece, field, i, {factor * kParameters[static_cast<size_t>(first + i)]}).ok());
      }
    }
  };
  fill_piece(1, 3, 2);
  refused = call(&ParameterServer::Stub::Pull, newest, &pulled);
  EXPECT_NE(refused.error_message().find("1 of this shard's 2 pieces are not filled yet"), std::string::npos)
      << refused.error_message();
  const grpc::Status skipped = fill(0, PARAMETERS, 1, {1.0f});
  EXPECT_EQ(skipped.error_code(), grpc::StatusCode::FAILED_PRECONDITION);
  EXPECT_NE(skipped.error_message().find("piece 0 ('a') PARAMETERS at element 1, but its next chunk starts at 0"),
            std::string::npos) << skipped.error_message();
  const grpc::Status past_the_end = fill(0, PARAMETERS, 0, {1.0f, 2.0f, 3.0f, 4.0f});  // piece "a" holds 3
  EXPECT_EQ(past_the_end.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_NE(past_the_end.error_message().find("piece 0 ('a'), which holds 3 values"), std::string::npos)
      << past_the_end.error_message();
  EXPECT_EQ(fill(2, PARAMETERS, 0, {1.0f}).error_code(), grpc::StatusCode::INVALID_ARGUMENT) << "no piece 2";
  EXPECT_EQ(fill(0, static_cast<Field>(3), 0, {1.0f}).error_code(), grpc::StatusCode::INVALID_ARGUMENT) << "no field 3";
  fill_piece(0, 0, 3);
  ASSERT_TRUE(call(&ParameterServer::Stub::Pull, newest, &pulled).ok());
  std::vector<float> values(5);
  from_bytes(pulled.parameters(), values.data(), 5, "pull");
  EXPECT_EQ(values, std::vector<float>(kParameters.begin(), kParameters.begin() + 5));
  // A field filled again from 0: the piece is not filled until that field is whole again.
  ASSERT_TRUE(fill(0, FIRST_MOMENT, 0, {-1.0f}).ok());
  EXPECT_EQ(call(&ParameterServer::Stub::Pull, newest, &pulled).error_code(), grpc::StatusCode::FAILED_PRECONDITION);
  ASSERT_TRUE(fill(0, FIRST_MOMENT, 1, {-2.0f, -3.0f}).ok());
  EXPECT_EQ(snapshot(FIRST_MOMENT), (std::vector<float>{-1.0f, -2.0f, -3.0f, 10 * kParameters[3], 10 * kParameters[4]}));
  // A chunk of one field of one piece: piece "b"'s second moment, element 1.
  SnapshotReply snapped;
  ASSERT_TRUE(call(&ParameterServer::Stub::Snapshot, snapshot_request(1, SECOND_MOMENT, 1, 1), &snapped).ok());
  std::vector<float> second(1);
  from_bytes(snapped.values(), second.data(), 1, "snapshot");
  EXPECT_EQ(second[0], 100 * kParameters[4]);
  EXPECT_EQ(snapshot(PARAMETERS), std::vector<float>(kParameters.begin(), kParameters.begin() + 5));
  for (const SnapshotRequest& wrong : {snapshot_request(7, PARAMETERS, 0, 1), snapshot_request(1, PARAMETERS, 1, 2),
                                       snapshot_request(1, PARAMETERS, 0, 0), snapshot_request(1, PARAMETERS, -1, 1)}) {
    EXPECT_EQ(call(&ParameterServer::Stub::Snapshot, wrong, &snapped).error_code(), grpc::StatusCode::INVALID_ARGUMENT)
        << wrong.ShortDebugString();
  }
}

TEST_F(ParameterServerTest, SynchronousStepRefusesWhatDoesNotBelongToIt) {
  start();
  load(true, 2);
  PushReply pushed;
  ASSERT_TRUE(call(&ParameterServer::Stub::Push, push_request(kSlice0, 0, 0), &pushed).ok());
  ReduceRequest reduce;
  reduce.set_generation(kGeneration);
  reduce.set_version(0);
  ReduceReply reduced;
  grpc::Status missing = call(&ParameterServer::Stub::Reduce, reduce, &reduced);
  EXPECT_EQ(missing.error_code(), grpc::StatusCode::FAILED_PRECONDITION);
  EXPECT_NE(missing.error_message().find("slice(s) 1"), std::string::npos) << missing.error_message();

  EXPECT_EQ(call(&ParameterServer::Stub::Push, push_request(kSlice0, 1, 0), &pushed).error_code(),
            grpc::StatusCode::FAILED_PRECONDITION) << "a push for a later step";
  EXPECT_EQ(call(&ParameterServer::Stub::Push, push_request(kSlice0, 0, 2), &pushed).error_code(),
            grpc::StatusCode::FAILED_PRECONDITION) << "slice 2 of 2";
  PushRequest past_the_end = push_request({1.0f, 2.0f}, 0, 1);
  past_the_end.set_offset(4);
  grpc::Status short_push = call(&ParameterServer::Stub::Push, past_the_end, &pushed);
  EXPECT_EQ(short_push.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_NE(short_push.error_message().find("8 bytes of gradients at element 4"), std::string::npos)
      << short_push.error_message();
  PushRequest other_generation = push_request(kSlice0, 0, 1);
  other_generation.set_generation(kGeneration + 1);
  grpc::Status stale = call(&ParameterServer::Stub::Push, other_generation, &pushed);
  EXPECT_EQ(stale.error_code(), grpc::StatusCode::FAILED_PRECONDITION);
  EXPECT_NE(stale.error_message().find("generation"), std::string::npos) << stale.error_message();
  PullReply pulled;
  EXPECT_EQ(call(&ParameterServer::Stub::Pull, pull_request(3), &pulled).error_code(), grpc::StatusCode::FAILED_PRECONDITION);
}

TEST_F(ParameterServerTest, AsynchronousPushesApplyOnArrivalOnceEachWithinTheStaleness) {
  start();
  load(false, /*slices (the workers)=*/2, /*max_staleness=*/1);
  PushReply pushed;
  // Elements [first, first + count) of `gradients` as a chunk of step `closure`'s push.
  auto push_chunk = [&](const std::vector<float>& gradients, int64_t first, int64_t count, int64_t version,
                        int64_t closure, double lr = 0.01, float grad_scale = 0.5f) {
    PushRequest request = push_request({gradients.begin() + first, gradients.begin() + first + count}, version, 0,
                                       closure, lr, grad_scale);
    request.set_offset(first);
    return call(&ParameterServer::Stub::Push, request, &pushed);
  };
  // A push in two chunks is applied when its last chunk comes.
  ASSERT_TRUE(push_chunk(kSlice0, 0, 2, 0, /*closure=*/0).ok());
  EXPECT_FALSE(pushed.applied());
  EXPECT_EQ(status().version(), 0);
  ASSERT_TRUE(push_chunk(kSlice0, 2, 3, 0, 0).ok());
  EXPECT_TRUE(pushed.applied());
  EXPECT_EQ(pushed.version(), 1);
  ReferenceAdamW reference(kParameters);
  std::vector<double> g0(5), g1(5);
  for (size_t i = 0; i < 5; ++i) {
    g0[i] = 0.5 * kSlice0[i];
    g1[i] = kSlice1[i];
  }
  reference.step(g0, 0.01, kDecays);
  // The same closure again (its worker died after pushing): ignored.
  ASSERT_TRUE(call(&ParameterServer::Stub::Push, push_request(kSlice0, 0, 0, 0, 0.01, 0.5f), &pushed).ok());
  EXPECT_FALSE(pushed.applied());
  // Computed on version 0, arriving at version 1: one update stale, allowed.
  ASSERT_TRUE(call(&ParameterServer::Stub::Push, push_request(kSlice1, 0, 0, 1, 0.02, 1.0f), &pushed).ok());
  EXPECT_TRUE(pushed.applied());
  reference.step(g1, 0.02, kDecays);
  expect_near(pull(), reference.p);
  // Computed on version 0, arriving at version 2: too stale, rejected and counted.
  ASSERT_TRUE(call(&ParameterServer::Stub::Push, push_request(kSlice1, 0, 0, 2, 0.02, 1.0f), &pushed).ok());
  EXPECT_FALSE(pushed.applied());
  EXPECT_TRUE(pushed.stale());
  EXPECT_EQ(status().stale_pushes(), 1);
  EXPECT_EQ(status().version(), 2);
  // Chunks pulled at different versions: the push counts as computed on the oldest (0: too stale).
  ASSERT_TRUE(push_chunk(kSlice1, 0, 2, 2, 3).ok());
  ASSERT_TRUE(push_chunk(kSlice1, 2, 3, 0, 3).ok());
  EXPECT_TRUE(pushed.stale());
  EXPECT_EQ(status().stale_pushes(), 2);
  expect_near(pull(), reference.p);
  grpc::Status unstarted = push_chunk(kSlice1, 2, 3, 2, 4);
  EXPECT_EQ(unstarted.error_code(), grpc::StatusCode::FAILED_PRECONDITION);
  EXPECT_NE(unstarted.error_message().find("no push of it is in progress"), std::string::npos) << unstarted.error_message();
  // At most a push in progress per worker (2): a third drops the one started first.
  for (int64_t closure : {5, 6, 7}) ASSERT_TRUE(push_chunk(kSlice1, 0, 2, 2, closure).ok());
  EXPECT_EQ(push_chunk(kSlice1, 2, 3, 2, 5).error_code(), grpc::StatusCode::FAILED_PRECONDITION) << "dropped";
  ASSERT_TRUE(push_chunk(kSlice1, 2, 3, 2, 6, 0.02, 1.0f).ok());
  EXPECT_TRUE(pushed.applied());
  reference.step(g1, 0.02, kDecays);
  expect_near(pull(), reference.p);
  PushRequest from_the_future = push_request(kSlice1, 5, 0, 8, 0.02, 1.0f);
  EXPECT_EQ(call(&ParameterServer::Stub::Push, from_the_future, &pushed).error_code(), grpc::StatusCode::INVALID_ARGUMENT);
}

TEST_F(ParameterServerTest, RefusesCallsBeforeLoadAndMalformedLoads) {
  start();
  PullReply pulled;
  grpc::Status empty = call(&ParameterServer::Stub::Pull, pull_request(-1), &pulled);
  EXPECT_EQ(empty.error_code(), grpc::StatusCode::FAILED_PRECONDITION);
  EXPECT_NE(empty.error_message().find("holds nothing"), std::string::npos) << empty.error_message();
  EXPECT_EQ(status().generation(), 0u);

  LoadReply loaded;
  LoadRequest no_pieces = load_request(true, 1, 0);
  no_pieces.clear_pieces();
  EXPECT_EQ(call(&ParameterServer::Stub::Load, no_pieces, &loaded).error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  LoadRequest forged_count = load_request(true, 1, 0);
  forged_count.mutable_pieces(0)->set_count(int64_t{1} << 40);  // must not allocate 4 TiB
  EXPECT_EQ(call(&ParameterServer::Stub::Load, forged_count, &loaded).error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  LoadRequest many_slices = load_request(true, 1 << 30, 0);
  EXPECT_EQ(call(&ParameterServer::Stub::Load, many_slices, &loaded).error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_EQ(status().generation(), 0u) << "nothing was loaded";
}

TEST_F(ParameterServerTest, OversizedMessagesGetAnErrorAndTheServerKeepsServing) {
  start({}, /*max_message_bytes=*/1 << 20);
  load(true, 1);
  PushReply pushed;
  const std::vector<float> huge(1 << 19, 1.0f);  // 2 MiB
  EXPECT_EQ(call(&ParameterServer::Stub::Push, push_request(huge, 0, 0), &pushed).error_code(),
            grpc::StatusCode::RESOURCE_EXHAUSTED);
  EXPECT_EQ(status().version(), 0);
  EXPECT_TRUE(call(&ParameterServer::Stub::Push, push_request(kSlice0, 0, 0), &pushed).ok());
}

// A reply carries at most a chunk (half the message limit): a pull or snapshot asking for more is
// refused by name, before a reply could pass the limit.
TEST_F(ParameterServerTest, RepliesCarryAtMostAChunk) {
  start({}, /*max_message_bytes=*/4096);  // a chunk: 512 values
  LoadRequest request = load_request(true, 1, 0);
  request.clear_pieces();
  PieceSpec* piece = request.add_pieces();
  piece->set_tensor("big");
  piece->set_count(1000);
  LoadReply loaded;
  ASSERT_TRUE(call(&ParameterServer::Stub::Load, request, &loaded).ok());
  const std::vector<float> values(512, 0.5f);
  for (Field field : {PARAMETERS, FIRST_MOMENT, SECOND_MOMENT}) {
    ASSERT_TRUE(fill(0, field, 0, values).ok());
    ASSERT_TRUE(fill(0, field, 512, {values.begin(), values.begin() + 488}).ok());
  }
  PullReply pulled;
  grpc::Status refused = call(&ParameterServer::Stub::Pull, pull_request(-1, 513), &pulled);
  EXPECT_EQ(refused.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_NE(refused.error_message().find("at most 512 a message"), std::string::npos) << refused.error_message();
  EXPECT_TRUE(call(&ParameterServer::Stub::Pull, pull_request(-1, 512), &pulled).ok());
  SnapshotReply snapped;
  refused = call(&ParameterServer::Stub::Snapshot, snapshot_request(0, PARAMETERS, 0, 513), &snapped);
  EXPECT_EQ(refused.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_NE(refused.error_message().find("at most 512 a message"), std::string::npos) << refused.error_message();
  EXPECT_TRUE(call(&ParameterServer::Stub::Snapshot, snapshot_request(0, PARAMETERS, 488, 512), &snapped).ok());
}

// Sends `bytes` as the raw request of `method`, as a client with another idea of the protocol would.
grpc::Status raw_call(const std::shared_ptr<grpc::Channel>& channel, const std::string& method, const std::string& bytes) {
  grpc::GenericStub generic(channel);
  grpc::ClientContext context;
  context.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(10));
  grpc::Slice slice(bytes);
  grpc::ByteBuffer request(&slice, 1), response;
  grpc::CompletionQueue queue;
  auto call = generic.PrepareUnaryCall(&context, method, request, &queue);
  call->StartCall();
  grpc::Status status;
  call->Finish(&response, &status, reinterpret_cast<void*>(1));
  void* tag = nullptr;
  bool ok = false;
  queue.Next(&tag, &ok);
  return status;
}

TEST_F(ParameterServerTest, FuzzedMessagesGetErrorsNeverACrash) {
  start();
  load(true, 2);
  std::mt19937_64 rng(1234);
  const std::vector<std::pair<std::string, std::string>> valid = {
      {"Load", load_request(true, 2, 0).SerializeAsString()},
      {"Push", push_request(kSlice0, 0, 1).SerializeAsString()},
      {"Pull", [] { PullRequest r; r.set_generation(kGeneration); r.set_count(2); return r.SerializeAsString(); }()},
      {"Reduce", [] { ReduceRequest r; r.set_generation(kGeneration); return r.SerializeAsString(); }()},
      {"Apply", [] { ApplyRequest r; r.set_generation(kGeneration); r.set_lr(0.1); return r.SerializeAsString(); }()},
      {"Snapshot", snapshot_request(1, FIRST_MOMENT, 0, 2).SerializeAsString()},
      {"Fill", [] {
         FillRequest r;
         r.set_generation(kGeneration);
         r.set_field(SECOND_MOMENT);
         r.set_values(to_bytes(kParameters.data(), 3));
         return r.SerializeAsString();
       }()}};
  int refused = 0, calls = 0;
  for (int round = 0; round < 150; ++round) {
    for (const auto& [method, message] : valid) {
      // Random bytes, and the valid message with a few bytes changed or cut short.
      std::string noise(rng() % 64, '\0');
      for (char& c : noise) c = static_cast<char>(rng());
      std::string mutated = message;
      for (int flips = 1 + static_cast<int>(rng() % 4); flips > 0 && !mutated.empty(); --flips) {
        mutated[rng() % mutated.size()] = static_cast<char>(rng());
      }
      if (rng() % 4 == 0) mutated.resize(rng() % (mutated.size() + 1));
      for (const std::string& bytes : {noise, mutated}) {
        grpc::Status result = raw_call(channel, "/paraflow.ps.ParameterServer/" + method, bytes);
        ++calls;
        if (!result.ok()) ++refused;
        EXPECT_NE(result.error_code(), grpc::StatusCode::UNAVAILABLE) << method << ": the server went away";
      }
    }
  }
  std::printf("  %d fuzzed calls, %d refused\n", calls, refused);
  EXPECT_GT(refused, calls / 2);
  // Still serving, and a clean load and step still work.
  load(true, 1);
  PushReply pushed;
  EXPECT_TRUE(call(&ParameterServer::Stub::Push, push_request(kSlice0, 0, 0), &pushed).ok());
}

TEST_F(ParameterServerTest, TokenIsRequiredWhenSet) {
  ChannelSecurity security;
  security.token = "s3cret-token";
  start(security);
  caller.token.clear();
  StatusReply reply;
  EXPECT_EQ(call(&ParameterServer::Stub::Status, StatusRequest(), &reply).error_code(), grpc::StatusCode::UNAUTHENTICATED);
  caller.token = "s3cret-tokem";
  LoadReply loaded;
  EXPECT_EQ(call(&ParameterServer::Stub::Load, load_request(true, 1, 0), &loaded).error_code(),
            grpc::StatusCode::UNAUTHENTICATED);
  caller.token = "s3cret-token";
  EXPECT_TRUE(call(&ParameterServer::Stub::Load, load_request(true, 1, 0), &loaded).ok());
}

TEST_F(ParameterServerTest, TlsServesTlsClientsOnly) {
  testing::TempDir dir;
  auto make_certificate = [&](const std::string& name) {
    const std::string command = fmt::format(
        "openssl req -x509 -newkey rsa:2048 -nodes -days 1 -subj /CN=paraflow -addext subjectAltName=IP:127.0.0.1 "
        "-keyout {0}/{1}.key -out {0}/{1}.pem > /dev/null 2>&1", dir.path().string(), name);
    ASSERT_EQ(std::system(command.c_str()), 0) << command;
  };
  make_certificate("server");
  make_certificate("stranger");
  const std::string base = dir.path().string();
  ChannelSecurity security = ChannelSecurity::from_files(base + "/server.pem", base + "/server.key", "", "");
  start(security);
  StatusReply reply;
  EXPECT_TRUE(call(&ParameterServer::Stub::Status, StatusRequest(), &reply).ok()) << "a client trusting the certificate";

  stub = ParameterServer::NewStub(open_channel(address, ChannelSecurity(), 1 << 20));
  EXPECT_EQ(call(&ParameterServer::Stub::Status, StatusRequest(), &reply).error_code(), grpc::StatusCode::UNAVAILABLE)
      << "a plaintext client";
  ChannelSecurity stranger = ChannelSecurity::from_files(base + "/stranger.pem", base + "/stranger.key", "", "");
  stub = ParameterServer::NewStub(open_channel(address, stranger, 1 << 20));
  EXPECT_EQ(call(&ParameterServer::Stub::Status, StatusRequest(), &reply).error_code(), grpc::StatusCode::UNAVAILABLE)
      << "a client trusting another certificate";

  EXPECT_THROW(ChannelSecurity::from_files(base + "/server.pem", "", "", ""), InputError);
  try {
    ChannelSecurity::from_files("", "", "", base + "/missing-token");
    FAIL() << "a missing token file";
  } catch (const InputError& e) {
    EXPECT_NE(std::string(e.what()).find("dist.auth_token_file"), std::string::npos) << e.what();
  }
}

// A one-layer model's worker, pulling from the ps task at `ps_address`, and a valid first step
// for it (slice 1 of 2 of batch 3).
struct TinyWorker {
  explicit TinyWorker(const std::string& ps_address, std::chrono::milliseconds timeout) {
    model_config.n_layer = 1;
    model_config.n_head = 2;
    model_config.n_embd = 8;
    model_config.vocab_size = 16;
    model_config.n_positions = 8;
    config.batch_size = 2;
    config.sequence_length = 4;
    WorkerSettings settings{"127.0.0.1:0", {ps_address}, ChannelSecurity(), timeout, 1 << 20, true, 2};
    task.emplace(model_config, config, data, cpu_backend(), placement, settings);
    channel = open_channel("127.0.0.1:" + std::to_string(task->port()), ChannelSecurity(), 1 << 20);
    step.set_generation(kGeneration);
    step.set_synchronous(true);
    step.set_batch_index(3);
    step.set_slice(1);
    step.set_slices(2);
    step.set_placement(placement.digest());
  }

  static std::vector<int32_t> tokens() {
    std::vector<int32_t> tokens(400);
    for (size_t i = 0; i < tokens.size(); ++i) tokens[i] = static_cast<int32_t>(i * 7 % 16);
    return tokens;
  }

  model::GptConfig model_config;
  train::TrainConfig config;
  train::TokenSource data = train::TokenSource::from_tokens(tokens(), 0.1);
  Placement placement = place_variables(model::gpt_tensor_specs(model_config), 1);
  std::optional<WorkerTask> task;
  std::shared_ptr<grpc::Channel> channel;
  StepRequest step;
};

// A worker's RunStep fed random and mutated requests: refusals (another placement, mode or
// slice), a failed pull from the empty ps task, never a crash.
TEST(WorkerServiceTest, FuzzedStepsGetErrorsNeverACrash) {
  ParameterServerTask ps("127.0.0.1:0", ChannelSecurity(), 1 << 20, cpu_backend());
  TinyWorker worker("127.0.0.1:" + std::to_string(ps.port()), std::chrono::milliseconds(2000));
  const std::string message = worker.step.SerializeAsString();
  std::mt19937_64 rng(99);
  std::map<grpc::StatusCode, int> codes;
  for (int round = 0; round < 300; ++round) {
    std::string mutated = message;
    for (int flips = 1 + static_cast<int>(rng() % 3); flips > 0; --flips) mutated[rng() % mutated.size()] = static_cast<char>(rng());
    std::string noise(rng() % 48, '\0');
    for (char& c : noise) c = static_cast<char>(rng());
    for (const std::string& bytes : {mutated, noise}) {
      grpc::Status result = raw_call(worker.channel, "/paraflow.ps.Worker/RunStep", bytes);
      EXPECT_FALSE(result.ok()) << "no step can succeed: the ps task holds nothing";
      EXPECT_NE(result.error_code(), grpc::StatusCode::UNAVAILABLE) << "the worker went away";
      ++codes[result.error_code()];
    }
  }
  grpc::Status unloaded = raw_call(worker.channel, "/paraflow.ps.Worker/RunStep", message);
  EXPECT_EQ(unloaded.error_code(), grpc::StatusCode::ABORTED) << unloaded.error_message();
  EXPECT_NE(unloaded.error_message().find("holds nothing"), std::string::npos) << unloaded.error_message();
  EXPECT_GT(codes[grpc::StatusCode::INVALID_ARGUMENT], 0);
}

// A worker over data with token ids past the model's vocabulary (byte-level text, 16 ids) refuses
// to start, as the trainer does, rather than feeding its embedding and loss ids they have no row for.
TEST(WorkerServiceTest, DataPastTheVocabularyIsRefused) {
  TinyWorker reference("127.0.0.1:1", std::chrono::milliseconds(1000));
  std::vector<int32_t> bytes(400);
  for (size_t i = 0; i < bytes.size(); ++i) bytes[i] = static_cast<int32_t>(i % 256);
  train::TokenSource text = train::TokenSource::from_tokens(bytes, 0.1);
  WorkerSettings settings{"127.0.0.1:0", {"127.0.0.1:1"}, ChannelSecurity(), std::chrono::milliseconds(1000), 1 << 20,
                          true, 2};
  try {
    WorkerTask worker(reference.model_config, reference.config, text, cpu_backend(), reference.placement, settings);
    FAIL() << "a worker started over token ids up to 255 with a vocabulary of 16";
  } catch (const InputError& e) {
    EXPECT_NE(std::string(e.what()).find("token id 255 but model.vocab_size is 16"), std::string::npos) << e.what();
  }
}

// A worker whose step waits on a ps task that accepts connections and never answers: until the
// step's pull runs out its deadline, Status says the worker is busy (the chief's pool would
// otherwise hand it another step, to wait behind this one); afterwards Status is OK again.
TEST(WorkerServiceTest, AWorkerStillInAStepAnswersStatusBusy) {
  const int silent = ::socket(AF_INET, SOCK_STREAM, 0);
  ASSERT_GE(silent, 0);
  sockaddr_in address{};
  address.sin_family = AF_INET;
  address.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  socklen_t length = sizeof(address);
  ASSERT_EQ(::bind(silent, reinterpret_cast<sockaddr*>(&address), sizeof(address)), 0);
  ASSERT_EQ(::listen(silent, 8), 0);
  ASSERT_EQ(::getsockname(silent, reinterpret_cast<sockaddr*>(&address), &length), 0);
  TinyWorker worker("127.0.0.1:" + std::to_string(ntohs(address.sin_port)), std::chrono::milliseconds(1500));
  auto status = [&] { return raw_call(worker.channel, "/paraflow.ps.Worker/Status", StatusRequest().SerializeAsString()); };
  ASSERT_TRUE(status().ok()) << status().error_message();

  auto step = std::async(std::launch::async,
                         [&] { return raw_call(worker.channel, "/paraflow.ps.Worker/RunStep", worker.step.SerializeAsString()); });
  grpc::Status busy;
  for (int attempt = 0; attempt < 100 && busy.ok(); ++attempt) {
    busy = status();
    if (busy.ok()) std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  EXPECT_EQ(busy.error_code(), grpc::StatusCode::UNAVAILABLE) << busy.error_message();
  EXPECT_NE(busy.error_message().find("still in an earlier step"), std::string::npos) << busy.error_message();
  EXPECT_FALSE(step.get().ok());
  EXPECT_TRUE(status().ok());
  ::close(silent);
}

TEST(PeerCallTest, AnUnreachablePeerFailsWithinTheDeadlineNamingIt) {
  auto stub = ParameterServer::NewStub(open_channel("127.0.0.1:1", ChannelSecurity(), 1 << 20));
  const auto start = std::chrono::steady_clock::now();
  try {
    call_peer("ps 3 (127.0.0.1:1)", "Status", *stub, &ParameterServer::Stub::Status, StatusRequest(),
              std::chrono::milliseconds(500), ChannelSecurity());
    FAIL() << "nothing listens on port 1";
  } catch (const PeerError& e) {
    EXPECT_TRUE(e.unreachable());
    EXPECT_NE(std::string(e.what()).find("ps 3 (127.0.0.1:1): Status failed"), std::string::npos) << e.what();
  }
  EXPECT_LT(std::chrono::steady_clock::now() - start, std::chrono::seconds(5));
}

}  // namespace
}  // namespace paraflow::ps
