// `paraflow`: parses the command line, calls one layer, prints. paraflow::Error is caught here
// and printed as one line. Exit status: 0 for success and --help/--version; 1 for bad input (a
// command line CLI11 refuses, or a paraflow::InputError); 2 for anything else.
#include <CLI/CLI.hpp>
#include <fmt/format.h>

#include "base/error.h"
#include "cli/commands.h"
#include "cli/stop_signal.h"

int main(int argc, char** argv) {
  paraflow::cli::receive_stop_signals_on_one_thread();
  CLI::App app{"paraflow: train GPT-style language models in parallel and serve them"};
  app.require_subcommand(1);
  app.set_version_flag("--version", "paraflow " PARAFLOW_VERSION);
  paraflow::cli::add_tokenizer_command(app);
  paraflow::cli::add_data_command(app);
  paraflow::cli::add_train_command(app);
  paraflow::cli::add_plan_command(app);
  paraflow::cli::add_eval_command(app);
  paraflow::cli::add_generate_command(app);
  paraflow::cli::add_serve_command(app);
  paraflow::cli::add_quantize_command(app);
  paraflow::cli::add_config_command(app);
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    // CLI11 prints the message (or the help) and has its own codes (105 for a failed check):
    // every refused command line is bad input, status 1.
    return app.exit(e) == 0 ? 0 : 1;
  } catch (const std::exception& e) {
    fmt::print(stderr, "error: {}\n", e.what());
    return paraflow::cli::exit_status(e);
  }
  return 0;
}
