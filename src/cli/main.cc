// `paraflow`: parses the command line, calls one layer, prints. paraflow::Error is caught here
// and printed as one line; the exit code is 1 for bad input, 2 for anything else.
#include <CLI/CLI.hpp>
#include <fmt/format.h>

#include "base/error.h"
#include "cli/commands.h"

int main(int argc, char** argv) {
  CLI::App app{"paraflow: train GPT-style language models in parallel and serve them"};
  app.require_subcommand(1);
  paraflow::cli::add_tokenizer_command(app);
  paraflow::cli::add_data_command(app);
  paraflow::cli::add_train_command(app);
  paraflow::cli::add_plan_command(app);
  paraflow::cli::add_eval_command(app);
  paraflow::cli::add_generate_command(app);
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    return app.exit(e);
  } catch (const paraflow::InputError& e) {
    fmt::print(stderr, "error: {}\n", e.what());
    return 1;
  } catch (const std::exception& e) {
    fmt::print(stderr, "error: {}\n", e.what());
    return 2;
  }
  return 0;
}
