// Subcommands of the `gpufeed` executable. Each Add*Command registers its
// options on `app`; its callback parses nothing further, calls the library,
// prints, and stores the process exit code in *exit_code.
#ifndef GPUFEED_CLI_COMMANDS_H_
#define GPUFEED_CLI_COMMANDS_H_

#include <CLI/CLI.hpp>

#include "gpufeed/encoded.h"
#include "gpufeed/status.h"

namespace gpufeed::cli {

void AddConvertCommand(CLI::App& app, int* exit_code);
void AddInspectCommand(CLI::App& app, int* exit_code);
void AddBenchCommand(CLI::App& app, int* exit_code);
void AddDevicesCommand(CLI::App& app, int* exit_code);
void AddTrainCommand(CLI::App& app, int* exit_code);
void AddServeCommand(CLI::App& app, int* exit_code);

// Adds --cache-bytes: a byte count, or "auto" (gpufeed::AutoCacheBytes(),
// reported by the command at start).
CLI::Option* AddCacheBytesOption(CLI::App* cmd, uint64_t* bytes, const std::string& help);

// Options of encoded image datasets (--image-size, --transform,
// --image-layout, --skip-corrupt); ignored for other datasets.
struct DecodeArgs {
  std::string size = "224", transform = "random_resized_crop", layout = "NCHW";
  bool skip_corrupt = false;
};
void AddDecodeOptions(CLI::App* cmd, DecodeArgs* args, const std::string& default_transform);
Result<DecodeOptions> ParseDecodeArgs(const DecodeArgs& args);

}  // namespace gpufeed::cli

#endif  // GPUFEED_CLI_COMMANDS_H_
