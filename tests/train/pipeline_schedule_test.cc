// The pipeline schedules, simulated: every stage runs its instruction list with blocking
// transfers (a send completes only when its peer's matching receive is posted, as large MPI
// messages do), and the simulation checks that no schedule deadlocks, that every message is
// received in the order it was sent, that backward passes follow their forwards, and how many
// micro-batches each stage holds at once. Then the layer partitions.
#include <gtest/gtest.h>

#include <fmt/format.h>

#include "train/pipeline_schedule.h"
#include "expect_error.h"

namespace paraflow::train {
namespace {

using Kind = PipelineInstruction::Kind;

struct Simulation {
  bool finished = false;
  std::vector<int64_t> peak_in_flight;  // per stage
  std::vector<int64_t> forwards, backwards;
};

Simulation simulate(PipelineSchedule schedule, int stages, int64_t micro_batches, bool train) {
  std::vector<std::vector<PipelineInstruction>> programs;
  for (int s = 0; s < stages; ++s) programs.push_back(pipeline_instructions(schedule, stages, s, micro_batches, train));
  std::vector<size_t> pc(static_cast<size_t>(stages), 0);
  // Per stage: whether the current transfer's send / receive half is done.
  std::vector<bool> sent(static_cast<size_t>(stages), false), received(static_cast<size_t>(stages), false);
  std::vector<std::vector<bool>> forwarded(static_cast<size_t>(stages), std::vector<bool>(micro_batches, false));
  std::vector<std::vector<bool>> has_input(static_cast<size_t>(stages), std::vector<bool>(micro_batches, false));
  std::vector<std::vector<bool>> has_grad(static_cast<size_t>(stages), std::vector<bool>(micro_batches, false));
  Simulation result;
  result.peak_in_flight.assign(static_cast<size_t>(stages), 0);
  result.forwards.assign(static_cast<size_t>(stages), 0);
  result.backwards.assign(static_cast<size_t>(stages), 0);
  std::vector<int64_t> in_flight(static_cast<size_t>(stages), 0);
  bool progress = true;
  while (progress) {
    progress = false;
    for (int s = 0; s < stages; ++s) {
      const auto us = static_cast<size_t>(s);
      if (pc[us] == programs[us].size()) continue;
      const PipelineInstruction& now = programs[us][pc[us]];
      if (now.kind == Kind::forward) {
        EXPECT_TRUE(s == 0 || has_input[us][now.micro]) << "stage " << s << " forward " << now.micro << " has no input";
        forwarded[us][now.micro] = true;
        ++result.forwards[us];
        result.peak_in_flight[us] = std::max(result.peak_in_flight[us], ++in_flight[us]);
        if (!train) --in_flight[us];
        ++pc[us];
        progress = true;
        continue;
      }
      if (now.kind == Kind::backward) {
        EXPECT_TRUE(forwarded[us][now.micro]);
        EXPECT_TRUE(s == stages - 1 || has_grad[us][now.micro]) << "stage " << s << " backward " << now.micro;
        ++result.backwards[us];
        --in_flight[us];
        ++pc[us];
        progress = true;
        continue;
      }
      // A send half completes when the peer's current instruction receives the same message.
      if (now.send && !sent[us]) {
        const int peer = now.send->peer;
        const auto up = static_cast<size_t>(peer);
        if (pc[up] < programs[up].size()) {
          const PipelineInstruction& theirs = programs[up][pc[up]];
          if (theirs.kind == Kind::transfer && theirs.recv && !received[up] && theirs.recv->peer == s) {
            EXPECT_EQ(theirs.recv->kind, now.send->kind) << "stage " << peer << " expects another message";
            EXPECT_EQ(theirs.recv->micro, now.send->micro) << "messages out of order between " << s << " and " << peer;
            sent[us] = received[up] = true;
            auto& arrived = now.send->kind == PipelineMessage::Kind::activation ? has_input[up] : has_grad[up];
            arrived[now.send->micro] = true;
            progress = true;
          }
        }
      }
      if ((!now.send || sent[us]) && (!now.recv || received[us])) {
        sent[us] = received[us] = false;
        ++pc[us];
        progress = true;
      }
    }
  }
  result.finished = true;
  for (int s = 0; s < stages; ++s) result.finished = result.finished && pc[static_cast<size_t>(s)] == programs[static_cast<size_t>(s)].size();
  return result;
}

TEST(PipelineSchedule, EveryScheduleRunsWithoutDeadlockAndHoldsAtMostItsBound) {
  for (PipelineSchedule schedule : {PipelineSchedule::gpipe, PipelineSchedule::one_f_one_b}) {
    for (int stages = 1; stages <= 5; ++stages) {
      for (int64_t m = 1; m <= 9; ++m) {
        SCOPED_TRACE(fmt::format("{} p={} m={}", pipeline_schedule_name(schedule), stages, m));
        Simulation run = simulate(schedule, stages, m, true);
        ASSERT_TRUE(run.finished) << "deadlock";
        for (int s = 0; s < stages; ++s) {
          EXPECT_EQ(run.forwards[static_cast<size_t>(s)], m);
          EXPECT_EQ(run.backwards[static_cast<size_t>(s)], m);
          // 1F1B: stage s holds min(p - s, m); GPipe holds all m.
          const int64_t bound = schedule == PipelineSchedule::gpipe ? m : std::min<int64_t>(stages - s, m);
          EXPECT_EQ(run.peak_in_flight[static_cast<size_t>(s)], bound) << "stage " << s;
          EXPECT_EQ(pipeline_in_flight(schedule, stages, s, m), bound);
        }
        Simulation evaluation = simulate(schedule, stages, m, false);
        ASSERT_TRUE(evaluation.finished) << "forward-only deadlock";
        EXPECT_EQ(evaluation.backwards[0], 0);
      }
    }
  }
}

TEST(PipelineSchedule, OneFOneBInterleavesAfterItsWarmUp) {
  // Stage 0 of 3 with 4 micro-batches: two warm-up forwards, then F2 B0 F3 B1, then B2 B3.
  std::string order;
  for (const PipelineInstruction& i : pipeline_instructions(PipelineSchedule::one_f_one_b, 3, 0, 4)) {
    if (i.kind == Kind::forward) order += fmt::format("F{} ", i.micro);
    if (i.kind == Kind::backward) order += fmt::format("B{} ", i.micro);
  }
  EXPECT_EQ(order, "F0 F1 F2 B0 F3 B1 B2 B3 ");
  // The last stage alternates from the start; its gradient sends pair with activation receives.
  const auto last = pipeline_instructions(PipelineSchedule::one_f_one_b, 3, 2, 4);
  int paired = 0;
  for (const PipelineInstruction& i : last) paired += i.kind == Kind::transfer && i.send && i.recv;
  EXPECT_EQ(paired, 3);
  EXPECT_DOUBLE_EQ(pipeline_bubble(4, 4), 3.0 / 7.0);
}

TEST(PipelineSchedule, LayersAreBalancedWithTheHeadOnTheLastStage) {
  model::GptConfig config;
  config.n_layer = 12;
  config.n_embd = 768;
  config.vocab_size = 50257;
  // By hand: a block is 24·768² + 4·1024·768 = 17.3 MFLOP per token, the head 2·768·50257 =
  // 77.2 MFLOP, 4.46 blocks. Two stages: 8 | 4 + head (8.46 blocks at most; 9 | 3 + head is 9).
  // Four stages: 4 | 4 | 4 | head alone (4.46), better than 3 | 4 | 4 | 1 + head (5.46).
  auto counts_of = [](const std::vector<model::LayerRange>& ranges) {
    std::vector<int64_t> counts;
    for (const auto& r : ranges) counts.push_back(r.end_layer - r.first_layer);
    return counts;
  };
  EXPECT_EQ(counts_of(partition_layers(config, 2, 1024)), (std::vector<int64_t>{8, 4}));
  auto ranges = partition_layers(config, 4, 1024);
  const std::vector<int64_t> expected{4, 4, 4, 0};
  EXPECT_EQ(counts_of(ranges), expected);
  EXPECT_TRUE(ranges[0].first && !ranges[0].last && ranges[3].last && !ranges[3].first);
  EXPECT_EQ(ranges[1].first_layer, 4);
  // One stage: the whole model.
  auto whole = partition_layers(config, 1, 1024);
  EXPECT_TRUE(whole[0].whole_model() && whole[0].first_layer == 0 && whole[0].end_layer == 12);
  // Given explicitly: the embedding alone on stage 0.
  auto given = partition_layers(config, 3, 1024, parse_layers_per_stage("0,6,6", "dist.stage_layers"));
  EXPECT_EQ(given[0].end_layer, 0);
  EXPECT_EQ(given[2].first_layer, 6);
}

TEST(PipelineSchedule, BadLayoutsAreRefusedByName) {
  model::GptConfig config;
  config.n_layer = 2;
  testing::expect_error<InputError>([&] { partition_layers(config, 5, 64); }, {"at least 3 blocks"});
  testing::expect_error<InputError>([&] { partition_layers(config, 2, 64, {1, 2}); }, {"adds up to 3 blocks"});
  testing::expect_error<InputError>([&] { partition_layers(config, 3, 64, {1, 0, 1}); }, {"stage 1 has 0 blocks"});
  testing::expect_error<InputError>([&] { partition_layers(config, 3, 64, {2}); }, {"lists 1 stages"});
  testing::expect_error<InputError>([&] { parse_layers_per_stage("1,x", "dist.stage_layers"); }, {"item 1 is 'x'"});
  testing::expect_error<InputError>([&] { parse_pipeline_schedule("zb"); }, {"dist.schedule: zb"});
}

}  // namespace
}  // namespace paraflow::train
