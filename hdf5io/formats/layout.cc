// GuessLayout (gpufeed/sample_source.h): what the formats' readers, convert
// and the statistics say of a sample shape without a stored layout.
#include <string>
#include <vector>

#include "gpufeed/names.h"
#include "gpufeed/sample_source.h"

namespace gpufeed {

std::string GuessLayout(const std::vector<uint64_t>& s) {
  if (s.size() != 3) return "";
  auto channels = [](uint64_t x) { return x == 1 || x == 3; };
  const std::string nchw(LayoutName(Layout::kNCHW)), nhwc(LayoutName(Layout::kNHWC));
  if (channels(s[0]) && !channels(s[2])) return nchw;
  if (channels(s[2]) && !channels(s[0])) return nhwc;
  if (s[0] == 4 && s[2] > 4) return nchw;  // RGBA
  if (s[2] == 4 && s[0] > 4) return nhwc;
  return "";
}

}  // namespace gpufeed
