// Each subcommand registers itself on the CLI11 app and runs from its callback.
#pragma once

#include <CLI/CLI.hpp>

#include <exception>

#include "base/error.h"

namespace paraflow::cli {

void add_train_command(CLI::App& app);
void add_generate_command(CLI::App& app);
void add_eval_command(CLI::App& app);
void add_tokenizer_command(CLI::App& app);
void add_data_command(CLI::App& app);
void add_plan_command(CLI::App& app);
void add_config_command(CLI::App& app);

// The exit status for an error: 1 for bad input (paraflow::InputError), 2 for anything else.
inline int exit_status(const std::exception& error) { return dynamic_cast<const InputError*>(&error) ? 1 : 2; }

}  // namespace paraflow::cli
