#include "hdf5io/formats/image_folder_listing.h"

#include <sys/stat.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <filesystem>
#include <system_error>

#include "hdf5io/io/read_file.h"

namespace gpufeed::image_folder {

// ---------------------------------------------------------------------------
// Listing the folder.

namespace {

std::string LowerExtension(const std::filesystem::path& p) {
  std::string ext = p.extension().string();
  std::transform(ext.begin(), ext.end(), ext.begin(),
                 [](unsigned char ch) { return static_cast<char>(std::tolower(ch)); });
  return ext;
}

bool IsImageExtension(const std::string& ext) { return ext == ".jpg" || ext == ".jpeg" || ext == ".png"; }

// Hidden entries are skipped: macOS leaves "._name.jpg" AppleDouble files and
// tools leave ".ipynb_checkpoints" folders; neither is a sample or a class.
bool IsHidden(const std::filesystem::path& p) {
  const std::string name = p.filename().string();
  return !name.empty() && name[0] == '.';
}

}  // namespace

Result<FolderListing> ListImageFolder(const std::string& dir) {
  namespace fs = std::filesystem;
  std::error_code ec;
  const fs::file_status st = fs::status(dir, ec);
  if (!fs::exists(st)) {
    return Status::NotFound(dir + ": no such directory" + (ec ? " (" + ec.message() + ")" : ""));
  }
  if (!fs::is_directory(st)) {
    return Status::InvalidArgument(dir + ": not a directory (an image folder holds one subfolder per class)");
  }
  FolderListing out;
  for (fs::directory_iterator it(dir, ec), end; !ec && it != end; it.increment(ec)) {
    if (IsHidden(it->path()) || !it->is_directory(ec)) continue;
    out.class_names.push_back(it->path().filename().string());
  }
  if (ec) return Status::IOError(dir + ": cannot list: " + ec.message());
  if (out.class_names.empty()) {
    return Status::InvalidArgument(dir + ": no class subfolders (expected " + dir + "/<class>/<image>.jpg)");
  }
  std::sort(out.class_names.begin(), out.class_names.end());

  for (size_t label = 0; label < out.class_names.size(); ++label) {
    const fs::path class_dir = fs::path(dir) / out.class_names[label];
    // Images in nested subfolders belong to the class too (as torchvision's
    // ImageFolder walks them); hidden folders are skipped.
    std::vector<std::pair<std::string, uint64_t>> files;  // path relative to the class folder, size
    for (fs::recursive_directory_iterator it(class_dir, fs::directory_options::follow_directory_symlink, ec), end;
         !ec && it != end; it.increment(ec)) {
      const fs::path& p = it->path();
      if (IsHidden(p)) {
        if (it->is_directory(ec)) it.disable_recursion_pending();
        continue;
      }
      if (!IsImageExtension(LowerExtension(p))) continue;
      std::error_code fec;
      if (!it->is_regular_file(fec)) continue;  // follows symlinks
      const uintmax_t size = it->file_size(fec);
      if (fec) return Status::IOError(p.string() + ": cannot stat: " + fec.message());
      files.emplace_back(p.lexically_relative(class_dir).string(),
                         size);  // the name in the folder, a link not resolved
    }
    if (ec) return Status::IOError(class_dir.string() + ": cannot list: " + ec.message());
    std::sort(files.begin(), files.end());
    for (const auto& [name, size] : files) {
      out.files.push_back((class_dir / name).string());
      out.labels.push_back(static_cast<int64_t>(label));
      out.total_bytes += size;
    }
  }
  if (out.files.empty()) {
    return Status::InvalidArgument(dir + ": no .jpg, .jpeg or .png files in its " +
                                   std::to_string(out.class_names.size()) + " class subfolders");
  }
  return out;
}

// Reads a whole file into `out` (resized to fit), through io (read_file.h).
Status ReadWholeFile(const std::string& path, std::vector<unsigned char>* out) { return io::ReadWholeFile(path, out); }

}  // namespace gpufeed::image_folder
