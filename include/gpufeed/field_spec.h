// A named field of a sample, as users write it: "NAME=/path", a field named
// NAME read from the dataset /path of every file (HDF5), or "NAME=PATTERN"
// for .npy files (gpufeed/sample_source.h). The name is what batches call
// the array (letters, digits, '_', '-', '.').
#ifndef GPUFEED_FIELD_SPEC_H_
#define GPUFEED_FIELD_SPEC_H_

#include <string>
#include <string_view>

#include "gpufeed/status.h"

namespace gpufeed {

struct FieldSpec {
  std::string name, path;
  // InvalidArgument names what is wrong and shows the form.
  static Result<FieldSpec> Parse(std::string_view text);
};

}  // namespace gpufeed

#endif  // GPUFEED_FIELD_SPEC_H_
