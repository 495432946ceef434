// The CLI's options for encoded image datasets (gpufeed/encoded.h), shared by
// `bench loader` and `train`.
#include "cli/commands.h"

namespace gpufeed::cli {

void AddDecodeOptions(CLI::App* cmd, DecodeArgs* a, const std::string& default_transform) {
  a->transform = default_transform;
  cmd->add_option("--image-size", a->size,
                  "encoded images: output HxW or S (square), decoded in the loader's threads (default 224)");
  cmd->add_option("--transform", a->transform,
                  "encoded images: random_resized_crop (training) or center_crop (evaluation: resize to "
                  "size/0.875, crop)")
      ->capture_default_str();
  cmd->add_option("--image-layout", a->layout, "encoded images: NCHW or NHWC")->capture_default_str();
  cmd->add_flag("--skip-corrupt", a->skip_corrupt,
                "encoded images: replace a sample that does not decode by the next one of its chunk (counted, "
                "logged) instead of failing");
}

Result<DecodeOptions> ParseDecodeArgs(const DecodeArgs& a) {
  DecodeOptions d;
  const size_t x = a.size.find_first_of("xX");
  try {
    size_t used = 0;
    const std::string hs = x == std::string::npos ? a.size : a.size.substr(0, x);
    const unsigned long h = std::stoul(hs, &used);
    if (used != hs.size()) throw std::invalid_argument(hs);
    unsigned long w = h;
    if (x != std::string::npos) {
      const std::string ws = a.size.substr(x + 1);
      w = std::stoul(ws, &used);
      if (used != ws.size()) throw std::invalid_argument(ws);
    }
    if (h == 0 || w == 0 || h > (1u << 15) || w > (1u << 15)) throw std::out_of_range(a.size);
    d.height = static_cast<uint32_t>(h);
    d.width = static_cast<uint32_t>(w);
  } catch (const std::exception&) {
    return Status::InvalidArgument("--image-size '" + a.size + "': expected S or HxW, 1..32768 (e.g. 224 or 224x224)");
  }
  auto t = ImageTransformFromName(a.transform);
  if (!t.ok()) return t.status().WithContext("--transform");
  d.transform = *t;
  d.layout = a.layout;
  d.skip_corrupt = a.skip_corrupt;
  GPUFEED_RETURN_IF_ERROR(ValidateDecodeOptions(d));
  return d;
}

}  // namespace gpufeed::cli
