// Subcommands of the `gpufeed` executable. Each Add*Command registers its
// options on `app`; its callback parses nothing further, calls the library,
// prints, and stores the process exit code in *exit_code.
#ifndef GPUFEED_CLI_COMMANDS_H_
#define GPUFEED_CLI_COMMANDS_H_

#include <CLI/CLI.hpp>

#include <cstdint>
#include <string>
#include <string_view>
#include <type_traits>
#include <vector>

#include "gpufeed/encoded.h"
#include "gpufeed/names.h"
#include "gpufeed/status.h"

namespace gpufeed::cli {

void AddConvertCommand(CLI::App& app, int* exit_code);
void AddInspectCommand(CLI::App& app, int* exit_code);
void AddBenchCommand(CLI::App& app, int* exit_code);
void AddDevicesCommand(CLI::App& app, int* exit_code);
void AddTrainCommand(CLI::App& app, int* exit_code);
void AddServeCommand(CLI::App& app, int* exit_code);

// Adds --cache-bytes: a size as the option table reads it (1073741824,
// 1GiB, 512MB; capi::ParseBytesOption, as Python's cache_bytes=), or "auto"
// (gpufeed::AutoCacheBytes(), reported by the command at start).
CLI::Option* AddCacheBytesOption(CLI::App* cmd, uint64_t* bytes, const std::string& help);

// Adds `flag`: a size outside the option table, read as it reads sizes
// (capi::ParseByteSize: 1073741824, 1GiB, 512MB).
CLI::Option* AddBytesOption(CLI::App* cmd, const std::string& flag, uint64_t* bytes, const std::string& help);

// A flag for option `option` of the C API's option table (capi/options.cc,
// gpufeed_option_*): its name ("--" and the option's, dashed, without a
// "feed_" prefix), its description and, for integers, its range come from
// the table's row, so the CLI, the C API and Python spell, describe and
// bound it alike; `target` and `remark` (a default or a use of the
// command's own) from the command. Booleans become flags. `flag`, where
// given, is the flag's name instead (a command's older spelling, such as
// train's --feed-slots). An option not in the table is a programming error
// (aborts at start, naming it).
CLI::Option* AddTableOption(CLI::App* cmd, std::string_view option, void* target, char type,
                            const std::string& remark = "", std::string_view flag = {});
template <typename T>
CLI::Option* AddTableOption(CLI::App* cmd, std::string_view option, T* target, const std::string& remark = "",
                            std::string_view flag = {}) {
  if constexpr (std::is_same_v<T, bool>) {
    return AddTableOption(cmd, option, static_cast<void*>(target), 'b', remark, flag);
  } else if constexpr (std::is_same_v<T, std::string>) {
    return AddTableOption(cmd, option, static_cast<void*>(target), 's', remark, flag);
  } else if constexpr (std::is_same_v<T, std::vector<std::string>>) {
    return AddTableOption(cmd, option, static_cast<void*>(target), 'v', remark, flag);  // repeatable
  } else if constexpr (std::is_same_v<T, int>) {
    return AddTableOption(cmd, option, static_cast<void*>(target), 'i', remark, flag);
  } else {
    static_assert(std::is_same_v<T, uint64_t>,
                  "AddTableOption: bool, std::string, std::vector<std::string>, int or uint64_t");
    return AddTableOption(cmd, option, static_cast<void*>(target), 'u', remark, flag);
  }
}

// An enum's names for CLI::IsMember, in its table's order (gpufeed/names.h),
// with `aliases` each followed by the other spellings of its value
// ("deflate", "gzip").
template <typename E>
std::vector<std::string> NamesOf(const NameTable<E>& table, bool aliases = false) {
  std::vector<std::string> out;
  for (const NameRow<E>& r : table.rows) {
    out.emplace_back(r.name);
    for (const NameAlias<E>& a : table.aliases) {
      if (aliases && a.value == r.value) out.emplace_back(a.name);
    }
  }
  return out;
}

// Options of encoded image datasets (--image-size, --transform,
// --image-layout, --skip-corrupt); ignored for other datasets.
// Their defaults are DecodeOptions' (its height and width are equal: S).
struct DecodeArgs {
  std::string size = std::to_string(DecodeOptions{}.height);
  std::string transform{ImageTransformName(DecodeOptions{}.transform)};
  std::string layout = DecodeOptions{}.layout;
  bool skip_corrupt = DecodeOptions{}.skip_corrupt;
};
void AddDecodeOptions(CLI::App* cmd, DecodeArgs* args, const std::string& default_transform);
Result<DecodeOptions> ParseDecodeArgs(const DecodeArgs& args);

}  // namespace gpufeed::cli

#endif  // GPUFEED_CLI_COMMANDS_H_
