// ExpandFiles (gpufeed/file_list.h): the files a many-file spec names (the
// objects of an s3:// glob or prefix: hdf5io/io/object_list.h).
#include "gpufeed/file_list.h"

#include <glob.h>
#include <sys/stat.h>

#include <algorithm>
#include <cctype>
#include <cerrno>
#include <cstring>
#include <filesystem>
#include <fstream>

#include "hdf5io/io/object_list.h"
#include "hdf5io/io/object_store.h"

namespace gpufeed {
namespace {

bool EndsWith(std::string_view s, std::string_view suffix) {
  return s.size() >= suffix.size() && s.substr(s.size() - suffix.size()) == suffix;
}

bool IsListFile(std::string_view p) { return EndsWith(p, ".txt") || EndsWith(p, ".list"); }

bool IsHdf5Name(const std::string& p) {
  return EndsWith(p, ".h5") || EndsWith(p, ".hdf5") || EndsWith(p, ".hdf") || EndsWith(p, ".nc");
}

bool IsDirectory(std::string_view p) {
  struct stat st;
  return ::stat(std::string(p).c_str(), &st) == 0 && S_ISDIR(st.st_mode);
}

}  // namespace

bool IsMultiFileSpec(std::string_view data) {
  if (io::IsRemoteUrl(data)) return io::IsObjectListSpec(data);
  if (data.find_first_of("*?[") != std::string_view::npos) return true;
  return IsDirectory(data) || IsListFile(data);
}

Result<std::vector<std::string>> ExpandFiles(std::string_view data_view) {
  const std::string data(data_view);
  std::vector<std::string> files;
  if (io::IsRemoteUrl(data)) {
    // Objects: a glob or prefix is listed by the store (sorted there); one
    // object is itself.
    if (io::IsObjectListSpec(data)) return io::ListObjects(data);
    files.push_back(data);
    return files;
  }
  if (IsDirectory(data)) {
    std::error_code ec;
    for (const auto& e : std::filesystem::directory_iterator(data, ec)) {
      if (e.is_regular_file(ec) && IsHdf5Name(e.path().filename().string())) files.push_back(e.path().string());
    }
    if (ec) return Status::IOError(data + ": cannot list the directory: " + ec.message());
    if (files.empty()) {
      return Status::NotFound(data + ": the directory has no .h5 / .hdf5 / .hdf / .nc files");
    }
  } else if (data.find_first_of("*?[") != std::string::npos) {
    glob_t g{};
    const int r = ::glob(data.c_str(), 0, nullptr, &g);
    for (size_t i = 0; r == 0 && i < g.gl_pathc; ++i) {
      if (!IsDirectory(g.gl_pathv[i])) files.emplace_back(g.gl_pathv[i]);
    }
    ::globfree(&g);
    if (files.empty()) return Status::NotFound(data + ": the pattern matches no files");
  } else if (IsListFile(data)) {
    std::ifstream in(data);
    if (!in) return Status::NotFound(data + ": cannot open the list of files: " + std::strerror(errno));
    const std::filesystem::path base = std::filesystem::path(data).parent_path();
    std::string line;
    while (std::getline(in, line)) {
      if (const size_t hash = line.find('#'); hash != std::string::npos) line.resize(hash);
      while (!line.empty() && std::isspace(static_cast<unsigned char>(line.back()))) line.pop_back();
      size_t start = 0;
      while (start < line.size() && std::isspace(static_cast<unsigned char>(line[start]))) ++start;
      line.erase(0, start);
      if (line.empty()) continue;
      if (io::IsRemoteUrl(line)) {
        if (io::IsObjectListSpec(line)) {
          return Status::InvalidArgument(data + ": '" + io::DisplayUrl(line) +
                                         "' names many objects; a list names one object (or file) a line");
        }
        files.push_back(line);  // an object URL, as written
        continue;
      }
      std::filesystem::path p(line);
      files.push_back(p.is_absolute() || base.empty() ? p.string() : (base / p).string());
    }
    if (files.empty()) return Status::NotFound(data + ": the list names no files");
    return files;  // a list's order is the user's
  } else {
    files.push_back(data);
    return files;
  }
  std::sort(files.begin(), files.end());
  return files;
}

}  // namespace gpufeed
