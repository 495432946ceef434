// ReadTokenFile (loader/remote/token.h).
#include "loader/remote/token.h"

#include <cctype>
#include <fstream>
#include <sstream>

#include "loader/remote/protocol.h"

namespace gpufeed::daemon {

Result<std::string> ReadTokenFile(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  if (!f) return Status::NotFound("token file '" + path + "' cannot be read");
  std::stringstream ss;
  ss << f.rdbuf();
  std::string t = ss.str();
  while (!t.empty() && std::isspace(static_cast<unsigned char>(t.back()))) t.pop_back();
  if (t.empty()) return Status::InvalidArgument("token file '" + path + "' is empty");
  if (t.size() > kMaxString) return Status::InvalidArgument("token file '" + path + "': token too long");
  return t;
}

}  // namespace gpufeed::daemon
