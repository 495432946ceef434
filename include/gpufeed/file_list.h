// The files a data spec names: one file, a glob ("data/*.h5", sorted by
// name), a directory (its *.h5 / *.hdf5 / *.hdf / *.nc files, sorted) or a
// text file (*.txt, *.list) listing one path per line (relative paths are
// relative to the list; '#' starts a comment; the list's order is kept; a
// line may be an object URL, s3:// or https://), or objects on S3: a glob
// (s3://BUCKET/dir/*.h5) or a prefix (s3://BUCKET/dir/), listed by the store
// and sorted by key (docs/object_storage.md, "Many objects").
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
// directory, or is a list file (*.txt, *.list); for an object URL, a glob
// or an s3:// prefix ending in '/' (an https URL's query is no pattern).
bool IsMultiFileSpec(std::string_view data);

// The files `data` names (see above); NotFound when there are none. A
// listing that would pass GPUFEED_REMOTE_MAX_OBJECTS is an error.
Result<std::vector<std::string>> ExpandFiles(std::string_view data);

}  // namespace gpufeed

#endif  // GPUFEED_FILE_LIST_H_
