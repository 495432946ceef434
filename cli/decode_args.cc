// The CLI's options for encoded image datasets (gpufeed/encoded.h), shared by
// `bench loader` and `train`.
#include "cli/commands.h"

namespace gpufeed::cli {

void AddDecodeOptions(CLI::App* cmd, DecodeArgs* a, const std::string& default_transform) {
  a->transform = default_transform;
  // --image-size sets the table's image_height and image_width at once.
  cmd->add_option("--image-size", a->size,
                  "encoded images: output HxW or S (square), decoded in the loader's threads (default 224)");
  // The others are rows of the C API's option table (AddTableOption).
  AddTableOption(cmd, "image_transform", &a->transform,
                 "encoded images; random_resized_crop for training, center_crop for evaluation: resize to "
                 "size/0.875, crop",
                 "--transform")
      ->capture_default_str();
  AddTableOption(cmd, "image_layout", &a->layout, "encoded images")->capture_default_str();
  AddTableOption(cmd, "skip_corrupt", &a->skip_corrupt,
                 "encoded images: by the next one of its chunk (counted, logged) instead of failing");
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
