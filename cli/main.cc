// `gpufeed`: a thin command line over the library. Subcommands live in
// *_cmd.cc; none holds logic the library does not also offer.
#include <CLI/CLI.hpp>

#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

#include "capi/c_api_internal.h"
#include "cli/commands.h"
#include "common/atomic_file.h"
#include "gpufeed/loader.h"
#include "gpufeed/version.h"

namespace gpufeed::cli {

CLI::Option* AddCacheBytesOption(CLI::App* cmd, uint64_t* bytes, const std::string& help) {
  // The option table's parser (capi/options.cc), as Python's cache_bytes=.
  return cmd
      ->add_option_function<std::string>(
          "--cache-bytes",
          [bytes](const std::string& v) {
            auto n = capi::ParseBytesOption("cache_bytes", v);
            if (!n.ok()) throw CLI::ValidationError("--cache-bytes", v + ": " + n.status().message());
            *bytes = *n;
            if (v == "auto") {
              std::fprintf(stderr, "gpufeed: --cache-bytes auto: %llu bytes (%.1f GiB: half the memory available)\n",
                           static_cast<unsigned long long>(*bytes), *bytes / double(1ull << 30));
            }
          },
          help + " (bytes, a size such as 512MiB or 1GiB, or auto: half the memory available)")
      ->type_name("BYTES|auto");
}

CLI::Option* AddBytesOption(CLI::App* cmd, const std::string& flag, uint64_t* bytes, const std::string& help) {
  return cmd
      ->add_option_function<std::string>(
          flag,
          [flag, bytes](const std::string& v) {
            auto n = capi::ParseByteSize(v);
            if (!n.ok()) throw CLI::ValidationError(flag, v + ": " + n.status().message());
            *bytes = *n;
          },
          help)
      ->type_name("BYTES");
}

// Counts, sizes and thread numbers are never negative: CLI11 converts "-5"
// into an unsigned option as 2^64 - 5 ("batch size 18446744073709551611")
// and takes it into an int one as it is ("--threads -3" ran), so every
// integer option of every command refuses a negative value, naming the
// option (none of gpufeed's takes one: even --level is 1..22 for zstd).
void RefuseNegativeCounts(CLI::App* app) {
  const CLI::Validator non_negative(
      [](std::string& value) -> std::string {
        const size_t at = value.find_first_not_of(" \t");
        if (at != std::string::npos && value[at] == '-') return value + " is negative: give 0 or more";
        return "";
      },
      "", "non-negative");
  for (CLI::Option* opt : app->get_options()) {
    const std::string type = opt->get_type_name();
    if (type == "UINT" || type == "INT") opt->check(non_negative);
  }
  for (CLI::App* sub : app->get_subcommands({})) RefuseNegativeCounts(sub);
}

}  // namespace gpufeed::cli

int main(int argc, char** argv) {
  // CUDA's hardware work queues, 32 (the most) rather than 8 unless the job
  // set them, before any CUDA context: with 8, the GPU decoder's streams
  // (nvJPEG's, the feed's) share queues with the model's and NCCL's, and
  // their work waits behind a training step (as the Python package does,
  // python/gpufeed/__init__.py; `gpufeed devices` shows the value).
  ::setenv("CUDA_DEVICE_MAX_CONNECTIONS", "32", /*overwrite=*/0);
  // Named here, not from argv[0]: usage lines say "gpufeed" however it was
  // started (the wheel's console script runs .../_native/bin/gpufeed).
  CLI::App app{"gpufeed: keeps GPUs fed from HDF5 datasets", "gpufeed"};
  app.require_subcommand(1);
  app.fallthrough();  // app-level flags (--trust-files) may follow the subcommand too
  app.set_version_flag("--version", "gpufeed " GPUFEED_VERSION);
  int exit_code = 0;
  // Before any subcommand runs (CLI11 runs a subcommand's callback after the
  // whole line is parsed, the app's options included).
  app.add_flag_callback(
      "--trust-files", [] { ::setenv("GPUFEED_TRUST_FILES", "1", 1); },
      "open HDF5 files without the crash-isolating probe process (for files you trust; saves a fork per file)");
  // The direct path's I/O for every dataset this process opens (IoMode in
  // gpufeed/dataset.h): an environment variable, so the daemon, train and
  // the bench commands take it without an option of their own.
  app.add_option_function<std::string>(
         "--io", [](const std::string& m) { ::setenv("GPUFEED_IO", m.c_str(), 1); },
         "how chunks are read: auto (direct when the file exceeds the memory available to the page cache), "
         "direct (O_DIRECT, page cache left alone; falls back to pread where refused) or buffered (pread)")
      ->check(CLI::IsMember(gpufeed::cli::NamesOf(gpufeed::kIoModeNames)));
  // Where the files a dataset names may lie besides its own directory
  // (OpenOptions::allow_paths), for every dataset this process opens: an
  // environment variable, as --io, so serve, train and inspect take it.
  std::vector<std::string> allow_paths;
  gpufeed::cli::AddTableOption(&app, "allow_paths", &allow_paths, "repeatable; GPUFEED_ALLOW_PATHS")
      ->each([](const std::string& dir) {
        const char* had = std::getenv("GPUFEED_ALLOW_PATHS");
        const std::string list = had != nullptr && had[0] != '\0' ? std::string(had) + ":" + dir : dir;
        ::setenv("GPUFEED_ALLOW_PATHS", list.c_str(), 1);
      })
      ->type_name("DIR");
  // convert, inspect and train remove their temporary output on Ctrl-C.
  gpufeed::RemoveTempFilesOnSignal();
  gpufeed::cli::AddConvertCommand(app, &exit_code);
  gpufeed::cli::AddInspectCommand(app, &exit_code);
  gpufeed::cli::AddBenchCommand(app, &exit_code);
  gpufeed::cli::AddDevicesCommand(app, &exit_code);
  gpufeed::cli::AddTrainCommand(app, &exit_code);
  gpufeed::cli::AddServeCommand(app, &exit_code);
  gpufeed::cli::RefuseNegativeCounts(&app);
  CLI11_PARSE(app, argc, argv);
  return exit_code;
}
