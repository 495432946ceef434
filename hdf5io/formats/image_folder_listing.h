// An image folder (DIR/<class>/<image>, classes nested or not): its files
// by class, read whole. Internal to hdf5io/: the image-folder source and the
// encoded converter both start from it.
#ifndef GPUFEED_FORMATS_IMAGE_FOLDER_LISTING_H_
#define GPUFEED_FORMATS_IMAGE_FOLDER_LISTING_H_

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "gpufeed/status.h"

namespace gpufeed::image_folder {

struct FolderListing {
  std::vector<std::string> class_names;
  std::vector<std::string> files;  // class by class, sorted within a class
  std::vector<int64_t> labels;     // parallel to files
  std::vector<uint64_t> sizes;     // parallel to files: bytes when listed (a link's target's)
  uint64_t total_bytes = 0;        // the sum of sizes
  // Where the files lie, for a check of what the folder reaches: a plain
  // file lies in the directory that lists it, so each directory that holds
  // a listed file is here once (as walked, links in it unresolved), and the
  // files that are symbolic links (judged by their targets) by index.
  std::vector<std::string> image_dirs;
  std::vector<uint64_t> linked_files;
};

// Asked before a folder is listed that the walk reached other than as a
// plain subdirectory (a class folder, a symbolic link to a directory, an
// entry whose kind readdir does not say), with its path as walked: a
// non-ok status ends the listing with it. What a file may reach is judged
// there, before the walk goes in (a link to "/" is refused at the link, not
// after the whole file system is listed).
using EnterCheck = std::function<Status(const std::string& dir)>;

// Lists `dir`'s image files (JPEG, PNG) class by class, with one fstatat a
// file (readdir's d_type says the rest); NotFound or InvalidArgument naming
// the folder when it has none, InvalidArgument naming a symbolic link that
// loops back to a folder above it, or what `may_enter` (when set) refuses.
Result<FolderListing> ListImageFolder(const std::string& dir, const EnterCheck& may_enter = nullptr);

// Reads `path` whole into out (a short read or an error names the file).
Status ReadWholeFile(const std::string& path, std::vector<unsigned char>* out);

}  // namespace gpufeed::image_folder

#endif  // GPUFEED_FORMATS_IMAGE_FOLDER_LISTING_H_
