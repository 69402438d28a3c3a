// `paraflow`: parses the command line, calls one layer, prints. paraflow::Error is caught here
// and printed as one line; the exit status is 1 for bad input, 2 for anything else.
#include <CLI/CLI.hpp>
#include <fmt/format.h>

#include "base/error.h"
#include "cli/commands.h"
#include "cli/stop_signal.h"

int main(int argc, char** argv) {
  paraflow::cli::receive_stop_signals_on_one_thread();
  CLI::App app{"paraflow: train GPT-style language models in parallel and serve them"};
  app.require_subcommand(1);
  paraflow::cli::add_tokenizer_command(app);
  paraflow::cli::add_data_command(app);
  paraflow::cli::add_train_command(app);
  paraflow::cli::add_plan_command(app);
  paraflow::cli::add_eval_command(app);
  paraflow::cli::add_generate_command(app);
  paraflow::cli::add_serve_command(app);
  paraflow::cli::add_config_command(app);
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    return app.exit(e);
  } catch (const std::exception& e) {
    fmt::print(stderr, "error: {}\n", e.what());
    return paraflow::cli::exit_status(e);
  }
  return 0;
}
