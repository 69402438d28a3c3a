// Each subcommand registers itself on the CLI11 app and runs from its callback.
#pragma once

#include <CLI/CLI.hpp>

namespace paraflow::cli {

void add_train_command(CLI::App& app);
void add_generate_command(CLI::App& app);
void add_eval_command(CLI::App& app);
void add_tokenizer_command(CLI::App& app);
void add_data_command(CLI::App& app);
void add_plan_command(CLI::App& app);

}  // namespace paraflow::cli
