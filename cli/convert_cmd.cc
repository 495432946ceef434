// `gpufeed convert`: any supported input → gpufeed's chunked HDF5.
#include <sys/stat.h>

#include <cstdio>
#include <nlohmann/json.hpp>

#include "cli/commands.h"
#include "cli/progress.h"
#include "gpufeed/convert.h"

namespace gpufeed::cli {
namespace {

struct ConvertArgs {
  std::string input, output, labels, size, layout = "NCHW", codec = "zstd";
  std::vector<std::string> class_names;
  int level = -1, threads = 0;
  uint64_t chunk_samples = 0;
  bool shuffle_filter = false, keep_encoded = false, json = false, skip_corrupt = false;
};

int RunConvert(const ConvertArgs& a, const CLI::App& cmd) {
  // Options that do not apply to this input are errors, not ignored.
  auto refuse = [](const std::string& m) {
    std::fprintf(stderr, "gpufeed convert: %s\n", m.c_str());
    return 2;
  };
  struct stat st {};
  const bool is_dir = ::stat(a.input.c_str(), &st) == 0 && S_ISDIR(st.st_mode);
  if (!is_dir) {
    for (const char* opt : {"--size", "--layout", "--skip-corrupt"}) {
      if (cmd.count(opt) > 0) return refuse(std::string(opt) + " applies to image folders; " + a.input + " is a file");
    }
  } else {
    if (cmd.count("--labels") > 0) {
      return refuse("--labels does not apply to an image folder: its labels are its class subfolders");
    }
    if (a.keep_encoded && cmd.count("--size") > 0) {
      return refuse("--size does not apply with --keep-encoded (the JPEG files are stored as they are)");
    }
  }
  if (a.codec == "none" && a.shuffle_filter) {
    return refuse("--shuffle-filter only helps a compressor; choose --codec deflate or zstd");
  }
  if (a.keep_encoded) {
    for (const char* opt : {"--codec", "--level", "--shuffle-filter", "--chunk-samples", "--skip-corrupt"}) {
      if (cmd.count(opt) > 0) return refuse(std::string(opt) + " does not apply with --keep-encoded");
    }
  }
  ConvertOptions opts;
  auto codec = CodecFromName(a.codec);
  if (!codec.ok()) {
    std::fprintf(stderr, "gpufeed convert: %s\n", codec.status().message().c_str());
    return 2;
  }
  opts.write.codec = *codec;
  opts.write.level = a.level;
  opts.write.shuffle_filter = a.shuffle_filter;
  opts.write.chunk_samples = a.chunk_samples;
  opts.write.class_names = a.class_names;
  opts.threads = a.threads;
  Progress progress("convert " + a.output);
  opts.progress = [&](uint64_t done, uint64_t total) { progress.Update(done, total); };

  ImageFolderOptions image;
  image.layout = a.layout;
  image.skip_corrupt = a.skip_corrupt;
  std::vector<std::string> skipped;
  image.skipped_files = &skipped;
  if (!a.size.empty()) {
    unsigned h = 0, w = 0;
    if (std::sscanf(a.size.c_str(), "%ux%u", &h, &w) != 2 || h == 0 || w == 0) {
      std::fprintf(stderr, "gpufeed convert: --size must be HxW (e.g. 224x224), got '%s'\n", a.size.c_str());
      return 2;
    }
    image.height = h;
    image.width = w;
  }
  Result<ConvertSummary> summary = Status::Internal("unreachable");
  std::string what;
  if (a.keep_encoded && !is_dir) {
    // An encoded field in HDF5 (an h5py vlen file): rewritten as bytes +
    // offsets so the loader reads it without HDF5's lock.
    summary = ConvertEncodedHdf5(a.input, a.output, opts);
    what = "encoded images of " + a.input;
  } else if (a.keep_encoded) {
    summary = ConvertEncodedImageFolder(a.input, a.output, opts);
    what = "encoded images";
  } else {
    auto source = OpenSource(a.input, a.labels, image);
    if (!source.ok()) {
      std::fprintf(stderr, "gpufeed convert: %s\n", source.status().ToString().c_str());
      return 1;
    }
    what = (*source)->description();
    for (const std::string& why : skipped) std::fprintf(stderr, "gpufeed convert: skipped %s\n", why.c_str());
    if (!skipped.empty()) {
      std::fprintf(stderr, "gpufeed convert: skipped %zu corrupt images (--skip-corrupt)\n", skipped.size());
    }
    summary = Convert(**source, a.output, opts);
  }
  progress.Finish();
  if (!summary.ok()) {
    std::fprintf(stderr, "gpufeed convert: %s\n", summary.status().ToString().c_str());
    return 1;
  }
  const ConvertSummary& s = *summary;
  const double ratio = s.output_bytes ? static_cast<double>(s.raw_bytes) / s.output_bytes : 0;
  const double mbps = s.seconds > 0 ? s.raw_bytes / s.seconds / 1e6 : 0;
  if (a.json) {
    nlohmann::json j = {{"input", a.input},
                        {"output", a.output},
                        {"samples", s.samples},
                        {"chunk_samples", s.chunk_samples},
                        {"input_bytes", s.input_bytes},
                        {"raw_bytes", s.raw_bytes},
                        {"output_bytes", s.output_bytes},
                        {"ratio", ratio},
                        {"seconds", s.seconds},
                        {"mb_per_s", mbps},
                        {"codec", a.keep_encoded ? "encoded" : a.codec},
                        {"mean", s.mean},
                        {"std", s.stddev}};
    std::printf("%s\n", j.dump(2).c_str());
  } else {
    std::printf("converted %s -> %s\n", what.c_str(), a.output.c_str());
    if (a.keep_encoded) {
      std::printf(
          "  samples %llu, stored as they are (/images/bytes + offsets; the loader decodes them: "
          "--image-size, --transform)\n",
          static_cast<unsigned long long>(s.samples));
    } else {
      std::printf("  samples %llu, chunk %llu samples, codec %s\n", static_cast<unsigned long long>(s.samples),
                  static_cast<unsigned long long>(s.chunk_samples), a.codec.c_str());
    }
    std::printf("  bytes in %.1f MB, raw %.1f MB, out %.1f MB (raw/out %.2fx)\n", s.input_bytes / 1e6,
                s.raw_bytes / 1e6, s.output_bytes / 1e6, ratio);
    std::printf("  %.2f s, %.1f MB/s raw\n", s.seconds, mbps);
    if (!s.mean.empty()) {
      std::printf("  per-channel mean/std:");
      for (size_t c = 0; c < s.mean.size(); ++c) std::printf(" %.3f/%.3f", s.mean[c], s.stddev[c]);
      std::printf("\n");
    }
  }
  return 0;
}

}  // namespace

void AddConvertCommand(CLI::App& app, int* exit_code) {
  auto args = std::make_shared<ConvertArgs>();
  CLI::App* cmd = app.add_subcommand(
      "convert", "Convert IDX (gzip or plain), .npy, an image folder or an HDF5 dataset to gpufeed's chunked HDF5");
  cmd->add_option("input", args->input, "IDX file, .npy file, folder of class subfolders, or HDF5 file[:/dataset]")
      ->required();
  cmd->add_option("-o,--output", args->output, "output .h5 file (written atomically)")->required();
  cmd->add_option("--labels", args->labels,
                  "labels: an IDX or .npy file, or for HDF5 input a dataset path in the same file");
  cmd->add_option("--size", args->size, "image folders: output size HxW (resize + center crop)");
  cmd->add_option("--layout", args->layout, "image folders: NCHW or NHWC")->check(CLI::IsMember({"NCHW", "NHWC"}));
  cmd->add_option("--class-names", args->class_names, "class names, label order (comma-separated)")->delimiter(',');
  cmd->add_flag("--skip-corrupt", args->skip_corrupt,
                "image folders: leave out images that do not decode (named and counted) instead of failing");
  cmd->add_flag("--keep-encoded", args->keep_encoded, "image folders: store the JPEG files as they are (/jpeg)");
  cmd->add_option("--chunk-samples", args->chunk_samples, "samples per chunk (default: about 2 MiB a chunk)");
  cmd->add_option("--codec", args->codec, "none, deflate or zstd")
      ->check(CLI::IsMember({"none", "deflate", "gzip", "zstd"}));
  cmd->add_option("--level", args->level, "compression level (default: deflate 4, zstd 3)");
  cmd->add_flag("--shuffle-filter", args->shuffle_filter, "apply HDF5's shuffle filter before compressing");
  cmd->add_option("--threads", args->threads, "compression threads (default: all cores)");
  cmd->add_flag("--json", args->json, "print the summary as JSON");
  cmd->callback([args, exit_code, cmd] { *exit_code = RunConvert(*args, *cmd); });
}

}  // namespace gpufeed::cli
