// FieldSpec::Parse (gpufeed/field_spec.h).
#include "gpufeed/field_spec.h"

#include <cctype>

namespace gpufeed {

Result<FieldSpec> FieldSpec::Parse(std::string_view text) {
  const size_t eq = text.find('=');
  if (eq == std::string_view::npos || eq == 0 || eq + 1 >= text.size()) {
    return Status::InvalidArgument("field '" + std::string(text) +
                                   "': expected NAME=/hdf5/path (for example data=/climate/data)");
  }
  FieldSpec f{std::string(text.substr(0, eq)), std::string(text.substr(eq + 1))};
  for (char c : f.name) {
    if (!(std::isalnum(static_cast<unsigned char>(c)) || c == '_' || c == '-' || c == '.')) {
      return Status::InvalidArgument("field '" + std::string(text) + "': the name '" + f.name +
                                     "' may use letters, digits, '_', '-' and '.' only");
    }
  }
  if (f.name == "indices") {
    return Status::InvalidArgument("field '" + std::string(text) +
                                   "': 'indices' is the name of the batch's sample indices; pick another name");
  }
  if (f.path[0] != '/') f.path = "/" + f.path;
  return f;
}

}  // namespace gpufeed
