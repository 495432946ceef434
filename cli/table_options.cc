// AddTableOption (cli/commands.h): CLI flags from the C API's option table.
#include <cstdio>
#include <cstdlib>
#include <string>
#include <string_view>
#include <vector>

#include "capi/c_api_internal.h"
#include "cli/commands.h"
#include "gpufeed/c_api.h"

namespace gpufeed::cli {

CLI::Option* AddTableOption(CLI::App* cmd, std::string_view option, void* target, char type, const std::string& remark,
                            std::string_view given_flag) {
  int row = -1;
  for (int i = 0; i < gpufeed_option_count(); ++i) {
    if (option == gpufeed_option_name(i)) row = i;
  }
  if (row < 0) {
    std::fprintf(stderr, "gpufeed: internal error: no option '%.*s' in the option table (capi/options.cc)\n",
                 static_cast<int>(option.size()), option.data());
    std::abort();
  }
  std::string flag(option);
  if (flag.rfind("feed_", 0) == 0) flag = flag.substr(5);
  for (char& c : flag) c = c == '_' ? '-' : c;
  flag = given_flag.empty() ? "--" + flag : std::string(given_flag);
  std::string help = gpufeed_option_doc(row);
  if (!remark.empty()) help += " (" + remark + ")";
  if (type == 'b') return cmd->add_flag(flag, *static_cast<bool*>(target), help);
  CLI::Option* opt = nullptr;
  if (type == 's') return cmd->add_option(flag, *static_cast<std::string*>(target), help);
  // One value an occurrence (repeat the flag for more), so that a value
  // does not swallow the positional arguments after it.
  if (type == 'v') {
    return cmd->add_option(flag, *static_cast<std::vector<std::string>*>(target), help)->allow_extra_args(false);
  }
  if (type == 'u' && std::string_view(gpufeed_option_type(row)) == "bytes") {
    // Sizes: 1073741824, 1GiB, 512MB (and auto where the row has it), read
    // by the table's parser as gpufeed_options_set and Python read them.
    auto* bytes = static_cast<uint64_t*>(target);
    return cmd
        ->add_option_function<std::string>(
            flag,
            [option = std::string(option), flag, bytes](const std::string& v) {
              auto n = capi::ParseBytesOption(option, v);
              if (!n.ok()) throw CLI::ValidationError(flag, v + ": " + n.status().message());
              *bytes = *n;
            },
            help)
        ->type_name("BYTES");
  }
  if (type == 'i') opt = cmd->add_option(flag, *static_cast<int*>(target), help);
  if (type == 'u') opt = cmd->add_option(flag, *static_cast<uint64_t*>(target), help);
  int64_t least = 0;
  uint64_t most = 0;
  if (opt != nullptr && gpufeed_option_range(row, &least, &most) == 1 && most <= uint64_t{INT64_MAX}) {
    opt->check(CLI::Range(least, static_cast<int64_t>(most)));
  }
  return opt;
}

}  // namespace gpufeed::cli
