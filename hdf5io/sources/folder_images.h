// An image folder (DIR/<class>/<image>, as torchvision's ImageFolder and
// DALI's file reader take it) read as it is: each file an encoded sample,
// decoded by the loader as encoded images in HDF5 are (gpufeed/encoded.h),
// with no conversion first. Internal to sources/: the door opens it.
#ifndef GPUFEED_SOURCES_FOLDER_IMAGES_H_
#define GPUFEED_SOURCES_FOLDER_IMAGES_H_

#include <memory>
#include <string>

#include "gpufeed/dataset.h"
#include "gpufeed/decode_options.h"
#include "gpufeed/encoded.h"
#include "gpufeed/status.h"

namespace gpufeed {

// The folder's JPEG and PNG files, class folder by class folder (sorted
// names: the label is the class's index), listed and their sizes taken
// once; each file must resolve (symbolic links followed) under the folder
// or under open.allow_paths / GPUFEED_ALLOW_PATHS, else InvalidArgument
// naming the file and the option. A read unit is one file, read whole with
// pread; a file whose size changed since the open is Corrupt ("rewritten?").
// storage() is EncodedStorage::kFolder.
Result<std::unique_ptr<EncodedImageSource>> OpenFolderImages(const std::string& dir, const OpenOptions& open,
                                                             const DecodeOptions& decode);

}  // namespace gpufeed

#endif  // GPUFEED_SOURCES_FOLDER_IMAGES_H_
