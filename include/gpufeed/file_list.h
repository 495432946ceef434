// The files a data spec names: one file, a glob ("data/*.h5", sorted by
// name), a directory (its *.h5 / *.hdf5 / *.hdf / *.nc files, sorted) or a
// text file (*.txt, *.list) listing one path per line (relative paths are
// relative to the list; '#' starts a comment; the list's order is kept).
// FieldSource (gpufeed/fields.h) and the .npy fields (gpufeed/sample_source.h)
// read their files through it.
#ifndef GPUFEED_FILE_LIST_H_
#define GPUFEED_FILE_LIST_H_

#include <string>
#include <string_view>
#include <vector>

#include "gpufeed/status.h"

namespace gpufeed {

// True when `data` names many files: it has glob characters (*?[), is a
// directory, or is a list file (*.txt, *.list).
bool IsMultiFileSpec(std::string_view data);

// The files `data` names (see above); NotFound when there are none.
Result<std::vector<std::string>> ExpandFiles(std::string_view data);

}  // namespace gpufeed

#endif  // GPUFEED_FILE_LIST_H_
