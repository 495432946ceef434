// `gpufeed`: a thin command line over the library. Subcommands live in
// *_cmd.cc; none holds logic the library does not also offer.
#include <CLI/CLI.hpp>

#include <cstdlib>

#include "cli/commands.h"
#include "common/atomic_file.h"

int main(int argc, char** argv) {
  CLI::App app{"gpufeed: keeps GPUs fed from HDF5 datasets"};
  app.require_subcommand(1);
  app.set_version_flag("--version", "gpufeed 0.1.0");
  int exit_code = 0;
  // Before any subcommand runs (CLI11 runs a subcommand's callback after the
  // whole line is parsed, the app's options included).
  app.add_flag_callback(
      "--trust-files", [] { ::setenv("GPUFEED_TRUST_FILES", "1", 1); },
      "open HDF5 files without the crash-isolating probe process (for files you trust; saves a fork per file)");
  // convert, inspect and train remove their temporary output on Ctrl-C.
  gpufeed::RemoveTempFilesOnSignal();
  gpufeed::cli::AddConvertCommand(app, &exit_code);
  gpufeed::cli::AddInspectCommand(app, &exit_code);
  gpufeed::cli::AddBenchCommand(app, &exit_code);
  gpufeed::cli::AddDevicesCommand(app, &exit_code);
  gpufeed::cli::AddTrainCommand(app, &exit_code);
  gpufeed::cli::AddServeCommand(app, &exit_code);
  CLI11_PARSE(app, argc, argv);
  return exit_code;
}
