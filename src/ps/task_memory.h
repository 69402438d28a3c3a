// Every task of a parameter-server job at the peak of each phase of a whole run, predicted
// without training (`paraflow plan --ps-tasks P --workers W`): what its peak RSS grows by over the
// same task with no model.
#pragma once

#include <vector>

#include "model/gpt_config.h"
#include "train/memory_report.h"

namespace paraflow::ps {

// The chief, the W workers and the P ps tasks (roles "chief", "worker", "ps"; indices within the
// role), tasks with identical predictions on one entry.
std::vector<train::RankPeaks> predict_task_peaks(const model::GptConfig& model, const train::TrainConfig& config,
                                                 int ps_tasks, int workers, bool synchronous, int threads);

}  // namespace paraflow::ps
