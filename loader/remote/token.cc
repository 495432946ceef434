// ReadTokenFile (loader/remote/token.h).
#include "loader/remote/token.h"

#include <cctype>

#include "hdf5io/io/read_file.h"
#include "loader/remote/protocol.h"

namespace gpufeed::daemon {

Result<std::string> ReadTokenFile(const std::string& path) {
  // Read whole through io (hdf5io/io/read_file.h), its size bounded before
  // anything is allocated: a token is at most kMaxString, and a file far
  // larger is not one.
  std::string t;
  Status read = io::ReadWholeFile(path, [&](uint64_t size) -> Result<std::byte*> {
    if (size > kMaxString + 4096) return Status::InvalidArgument("token file '" + path + "': token too long");
    t.resize(size);
    return reinterpret_cast<std::byte*>(t.data());
  });
  if (!read.ok()) {
    if (read.message().starts_with("token file")) return read;
    return Status::NotFound("token file '" + path + "' cannot be read: " + read.message());
  }
  while (!t.empty() && std::isspace(static_cast<unsigned char>(t.back()))) t.pop_back();
  if (t.empty()) return Status::InvalidArgument("token file '" + path + "' is empty");
  if (t.size() > kMaxString) return Status::InvalidArgument("token file '" + path + "': token too long");
  return t;
}

}  // namespace gpufeed::daemon
