// tilerope: the command-line program. Subcommands: check, apply, freqs, run, bench, info.
// Every error prints "tilerope: error: <message>" and exits 2.

#include <CLI/CLI.hpp>
#include <cstdio>
#include <exception>
#include <string>

#include "commands.h"
#include "tilerope/error.h"

namespace {

int fail(const std::string& message) {
  std::fprintf(stderr, "tilerope: error: %s\n", message.c_str());
  return 2;
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"tilerope: rotary position embedding kernels, checked against an fp64 golden"};
  app.require_subcommand(1);
  int exit_code = 0;
  tilerope::cli::add_check_command(app, exit_code);
  tilerope::cli::add_apply_command(app);
  tilerope::cli::add_freqs_command(app);
  tilerope::cli::add_run_command(app, exit_code);
  tilerope::cli::add_bench_command(app);
  tilerope::cli::add_info_command(app);
  try {
    app.parse(argc, argv);
  } catch (const CLI::CallForHelp& e) {
    return app.exit(e);
  } catch (const CLI::CallForAllHelp& e) {
    return app.exit(e);
  } catch (const CLI::ParseError& e) {
    if (e.get_exit_code() == 0) return app.exit(e);
    return fail(e.what());
  } catch (const tilerope::error& e) {
    return fail(e.what());
  } catch (const std::exception& e) {
    return fail(e.what());
  }
  return exit_code;
}
