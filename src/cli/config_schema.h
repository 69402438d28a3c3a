// Every key of a training config (`paraflow train|eval|plan --config`): type, default, valid
// values and meaning, in one table. docs/training.md's key table is its Markdown (`paraflow config keys`).
#pragma once

#include "base/config.h"

namespace paraflow::cli {

const ConfigSchema& run_config_schema();

}  // namespace paraflow::cli
