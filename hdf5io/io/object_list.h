// Many objects as one dataset: the s3:// objects a glob or a prefix names,
// found by ListObjectsV2 (paginated by its continuation token), as
// ExpandFiles (gpufeed/file_list.h) finds a local glob's or directory's
// files; it is the one place either is decided.
//
//   s3://BUCKET/PREFIX/*.h5   the keys matching the pattern ('*', '?' and
//                             '[...]' as glob(3) has them: none crosses a '/')
//   s3://BUCKET/PREFIX/       the HDF5-named keys (.h5, .hdf5, .hdf, .nc)
//                             directly under PREFIX/, as a local directory's
//   s3://BUCKET/              the same at the bucket's top
//
// Sorted by key (byte order), at most GPUFEED_REMOTE_MAX_OBJECTS of them
// (default 100000): more is an error naming the variable, not a dataset
// whose opening takes hours. GPUFEED_REMOTE_LIST_PAGE (1 to 1000, default
// 1000, S3's own page size) is the keys asked for a page. Requests are
// signed, timed, retried and their failures named as an object read's
// (hdf5io/io/http_file.h). An http(s) server has no listing: a glob of
// https URLs is refused, naming the .txt list of URLs to use instead.
#ifndef GPUFEED_IO_OBJECT_LIST_H_
#define GPUFEED_IO_OBJECT_LIST_H_

#include <string>
#include <string_view>
#include <vector>

#include "gpufeed/status.h"

namespace gpufeed::io {

// True when `spec` (an object URL) names many objects (see above): glob
// characters in its path, or an s3:// key that is empty or ends in '/'. An
// http(s) URL's query ('?' of a presigned URL) is not a pattern.
bool IsObjectListSpec(std::string_view spec);

// The objects `spec` names, as s3://BUCKET/KEY URLs sorted by key; NotFound
// when none, InvalidArgument past the bound, for an http(s) glob, or on 403.
Result<std::vector<std::string>> ListObjects(std::string_view spec);

}  // namespace gpufeed::io

#endif  // GPUFEED_IO_OBJECT_LIST_H_
