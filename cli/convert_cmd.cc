// `gpufeed convert`: any supported input → gpufeed's chunked HDF5.
#include <cstdio>
#include <cstdlib>
#include <nlohmann/json.hpp>

#include "capi/c_api_internal.h"
#include "cli/commands.h"
#include "cli/progress.h"
#include "gpufeed/convert.h"
#include "gpufeed/fields.h"
#include "gpufeed/local_source.h"

namespace gpufeed::cli {
namespace {

struct ConvertArgs {
  // The library's default codec (deflate: any HDF5 reader decodes it).
  std::string input, output, labels, size, layout{LayoutName(Layout::kNCHW)},
      codec = std::string(CodecName(WriteOptions{}.codec));
  std::string shard_size;
  std::vector<std::string> class_names, fields;
  bool no_sample_axis = false;
  int level = -1, threads = 0;
  uint64_t chunk_samples = 0;
  // --shuffle-filter / --no-shuffle-filter as given; neither: the library's
  // default (on, for dtypes of 2 bytes or more).
  bool shuffle_filter = false, no_shuffle_filter = false;
  bool keep_encoded = false, json = false, skip_corrupt = false;
  bool Shuffle() const { return !no_shuffle_filter && (shuffle_filter || WriteOptions{}.shuffle_filter); }
};

// What a reader of `output` needs besides HDF5 itself, said after a convert
// that wrote a codec stock HDF5 builds do not decode (on stderr: --json
// keeps stdout for its summary). h5dump prints an empty DATA {} and exits
// 0 on such a file: the user hears it here, not from a colleague.
void SayWhatReadersNeed(const std::string& codec, const std::string& output) {
  if (codec != "zstd") return;
  std::fprintf(stderr,
               "gpufeed convert: %s is zstd-compressed (HDF5 filter 32015), which stock HDF5 does not decode: "
               "h5py, h5dump and other HDF5 programs need a zstd filter plugin on HDF5_PLUGIN_PATH (gpufeed's "
               "libgpufeed_h5zstd.so: build/hdf5-plugins, dist/gpufeed/lib/hdf5-plugins; the wheel installs it "
               "for its environment; or hdf5plugin's). The default, --codec deflate, opens in any HDF5 reader.\n",
               output.c_str());
}

// Named fields or many files: FieldSource (HDF5) or OpenNpyFields, then
// ConvertFields (one file or shards).
int RunConvertFields(const ConvertArgs& a, const CLI::App& cmd, const SourceDecision& decided) {
  const bool npy = decided.kind == SourceKind::kNpyFields;
  auto refuse = [](const std::string& m) {
    std::fprintf(stderr, "gpufeed convert: %s\n", m.c_str());
    return 2;
  };
  for (const char* opt : {"--labels", "--size", "--layout", "--skip-corrupt", "--keep-encoded", "--class-names"}) {
    if (cmd.count(opt) > 0) {
      return refuse(std::string(opt) +
                    " does not apply to named fields / many files (every field is converted "
                    "as it is, labels included as a field)");
    }
  }
  if (a.codec == "none" && a.shuffle_filter) {
    return refuse("--shuffle-filter only helps a compressor; choose --codec deflate or zstd");
  }
  FieldConvertOptions opts;
  if (!a.shard_size.empty()) {
    // Sizes as every option reads them (the option table's parser).
    auto bytes = capi::ParseByteSize(a.shard_size);
    if (!bytes.ok() || *bytes == 0) {
      return refuse("--shard-size " + a.shard_size + ": " +
                    (bytes.ok() ? std::string("more than 0 bytes") : bytes.status().message()));
    }
    opts.shard_bytes = *bytes;
  }
  auto codec = CodecFromName(a.codec);
  if (!codec.ok()) return refuse(codec.status().message());
  opts.convert.write.codec = *codec;
  opts.convert.write.level = a.level;
  opts.convert.write.shuffle_filter = a.Shuffle();
  opts.convert.write.chunk_samples = a.chunk_samples;
  opts.convert.threads = a.threads;
  Progress progress("convert " + a.output);
  opts.convert.progress = [&](uint64_t done, uint64_t total) { progress.Update(done, total); };
  std::unique_ptr<ChunkSource> source;
  if (npy) {
    auto s = OpenNpyFields(a.fields, a.no_sample_axis);
    if (!s.ok()) {
      std::fprintf(stderr, "gpufeed convert: %s\n", s.status().ToString().c_str());
      return 1;
    }
    source = std::move(*s);
  } else {
    auto s = OpenDecidedSource(a.input, decided, {});
    if (!s.ok()) {
      std::fprintf(stderr, "gpufeed convert: %s\n", s.status().ToString().c_str());
      return 1;
    }
    source = std::move(s->fields);
  }
  auto summary = ConvertFields(*source, a.output, opts);
  progress.Finish();
  if (!summary.ok()) {
    std::fprintf(stderr, "gpufeed convert: %s\n", summary.status().ToString().c_str());
    return 1;
  }
  const ConvertSummary& s = summary->totals;
  SayWhatReadersNeed(a.codec, summary->outputs.front());
  const double ratio = s.output_bytes ? static_cast<double>(s.raw_bytes) / s.output_bytes : 0;
  const double mbps = s.seconds > 0 ? s.raw_bytes / s.seconds / 1e6 : 0;
  if (a.json) {
    nlohmann::json fields = nlohmann::json::array();
    for (const FieldStats& f : summary->stats) {
      fields.push_back({{"name", f.name},
                        {"path", f.path},
                        {"channel_axis", f.channel_axis},
                        {"mean", f.means()},
                        {"std", f.stddevs()}});
    }
    nlohmann::json j = {{"input", npy ? "npy" : a.input},
                        {"outputs", summary->outputs},
                        {"samples", s.samples},
                        {"shard_samples", summary->shard_samples},
                        {"chunk_samples", s.chunk_samples},
                        {"raw_bytes", s.raw_bytes},
                        {"output_bytes", s.output_bytes},
                        {"ratio", ratio},
                        {"seconds", s.seconds},
                        {"mb_per_s", mbps},
                        {"codec", a.codec},
                        {"fields", fields}};
    std::printf("%s\n", j.dump(2).c_str());
    return 0;
  }
  std::printf("converted %s -> %s%s\n", source->name().c_str(), summary->outputs.front().c_str(),
              summary->outputs.size() > 1 ? (" ... " + summary->outputs.back()).c_str() : "");
  std::printf("  samples %llu in %zu file%s (%llu a shard), chunk %llu samples, codec %s\n",
              static_cast<unsigned long long>(s.samples), summary->outputs.size(),
              summary->outputs.size() == 1 ? "" : "s", static_cast<unsigned long long>(summary->shard_samples),
              static_cast<unsigned long long>(s.chunk_samples), a.codec.c_str());
  std::printf("  raw %.1f MB, out %.1f MB (raw/out %.2fx), %.2f s, %.1f MB/s raw\n", s.raw_bytes / 1e6,
              s.output_bytes / 1e6, ratio, s.seconds, mbps);
  for (const FieldStats& f : summary->stats) {
    std::printf("  %s (%s) mean/std:", f.name.c_str(), f.path.c_str());
    for (const ChannelStats& c : f.channels) std::printf(" %.4g/%.4g", c.mean, c.stddev);
    std::printf("\n");
  }
  return 0;
}

// An option given that does not apply to this input (one file or an image
// folder, decoded or kept encoded): what to say; empty if none.
std::string RefusedOption(const ConvertArgs& a, const CLI::App& cmd, bool is_dir) {
  for (const char* opt : {"--shard-size", "--no-sample-axis"}) {
    if (cmd.count(opt) > 0) {
      return std::string(opt) + " applies to named fields / many files (--field NAME=/path, a glob or a list)";
    }
  }
  if (!is_dir) {
    for (const char* opt : {"--size", "--layout", "--skip-corrupt"}) {
      if (cmd.count(opt) > 0) return std::string(opt) + " applies to image folders; " + a.input + " is a file";
    }
  } else {
    if (cmd.count("--labels") > 0) {
      return "--labels does not apply to an image folder: its labels are its class subfolders";
    }
    if (a.keep_encoded && cmd.count("--size") > 0) {
      return "--size does not apply with --keep-encoded (the JPEG files are stored as they are)";
    }
  }
  if (a.codec == "none" && a.shuffle_filter) {
    return "--shuffle-filter only helps a compressor; choose --codec deflate or zstd";
  }
  if (a.keep_encoded) {
    for (const char* opt : {"--codec", "--level", "--shuffle-filter", "--no-shuffle-filter", "--chunk-samples"}) {
      if (cmd.count(opt) > 0) return std::string(opt) + " does not apply with --keep-encoded";
    }
    if (!is_dir && cmd.count("--skip-corrupt") > 0) {
      return "--skip-corrupt with --keep-encoded applies to image folders; " + a.input + " is a file";
    }
  }
  return "";
}

// What the conversion of one input did, as text or JSON (--json).
void PrintConvertReport(const ConvertArgs& a, const ConvertSummary& s, const std::string& what, size_t skipped) {
  if (!a.keep_encoded) SayWhatReadersNeed(a.codec, a.output);
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
                        {"std", s.stddev},
                        {"skipped", skipped}};
    std::printf("%s\n", j.dump(2).c_str());
  } else {
    std::printf("converted %s -> %s\n", what.c_str(), a.output.c_str());
    if (skipped > 0) std::printf("  skipped %zu files that do not decode (named above)\n", skipped);
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
}

int RunConvert(const ConvertArgs& a, const CLI::App& cmd) {
  // Options that do not apply to this input are errors, not ignored.
  auto refuse = [](const std::string& m) {
    std::fprintf(stderr, "gpufeed convert: %s\n", m.c_str());
    return 2;
  };
  const char* kNameInput = "name the INPUT (or .npy fields: --field NAME='dir/*_NAME.npy')";
  if (a.input.empty() && a.fields.empty()) return refuse(kNameInput);
  // The door decides what the input is (gpufeed/local_source.h), as for
  // every other command: .npy fields, named fields or many files, an image
  // folder, one HDF5 file (probed there, once: what opens it takes that), a
  // .npy or an IDX file.
  OpenOptions open;
  open.fields = a.fields;
  open.labels_path = a.labels;
  open.no_sample_axis = a.no_sample_axis;
  auto decided = DecideSourceKind(a.input, open);
  if (!decided.ok()) {
    std::fprintf(stderr, "gpufeed convert: %s\n", decided.status().ToString().c_str());
    return 1;
  }
  const bool npy = decided->kind == SourceKind::kNpyFields;
  if (npy && !a.input.empty()) {
    return refuse("--field NAME=FILES.npy names the input; drop " + a.input + " (or give HDF5 paths: NAME=/path)");
  }
  if (a.input.empty() && !npy) return refuse(kNameInput);
  if (npy || decided->kind == SourceKind::kFields) return RunConvertFields(a, cmd, *decided);
  const bool is_dir = decided->kind == SourceKind::kImageFolder;
  if (std::string why = RefusedOption(a, cmd, is_dir); !why.empty()) return refuse(why);
  ConvertOptions opts;
  auto codec = CodecFromName(a.codec);
  if (!codec.ok()) {
    std::fprintf(stderr, "gpufeed convert: %s\n", codec.status().message().c_str());
    return 2;
  }
  opts.write.codec = *codec;
  opts.write.level = a.level;
  opts.write.shuffle_filter = a.Shuffle();
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
    summary = ConvertEncodedHdf5(a.input, *decided, a.output, opts);
    what = "encoded images of " + a.input;
  } else if (a.keep_encoded) {
    summary = ConvertEncodedImageFolder(a.input, a.output, opts, a.skip_corrupt, &skipped);
    what = "encoded images";
    for (const std::string& why : skipped) std::fprintf(stderr, "gpufeed convert: skipped %s\n", why.c_str());
    if (!skipped.empty()) {
      std::fprintf(stderr, "gpufeed convert: skipped %zu images that do not decode (--skip-corrupt)\n", skipped.size());
    }
  } else {
    auto source = OpenSource(a.input, *decided, image);
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
  PrintConvertReport(a, *summary, what, skipped.size());
  return 0;
}

}  // namespace

void AddConvertCommand(CLI::App& app, int* exit_code) {
  auto args = std::make_shared<ConvertArgs>();
  CLI::App* cmd = app.add_subcommand(
      "convert", "Convert IDX (gzip or plain), .npy, an image folder or an HDF5 dataset to gpufeed's chunked HDF5");
  cmd->add_option("input", args->input,
                  "IDX file, .npy file, folder of class subfolders, HDF5 file[:/dataset], or many HDF5 files "
                  "('DIR/*.h5', a DIR of them, LIST.txt)");
  cmd->add_option("--field", args->fields,
                  "NAME=/hdf5/path (of INPUT's files) or NAME='dir/*_NAME.npy' (.npy files, no INPUT): a named "
                  "field, repeatable, in order");
  cmd->add_option("--shard-size", args->shard_size,
                  "fields / many files: write OUT-00000.h5, OUT-00001.h5, ... of about this many decoded bytes each "
                  "(4GiB, 512MiB, 2GB)");
  cmd->add_flag("--no-sample-axis", args->no_sample_axis,
                "each file is one sample without a sample axis (.npy files; HDF5 files such as DeepCAM's)");
  cmd->add_option("-o,--output", args->output, "output .h5 file (written atomically)")->required();
  cmd->add_option("--labels", args->labels,
                  "labels: an IDX or .npy file, or for HDF5 input a dataset path in the same file");
  cmd->add_option("--size", args->size, "image folders: output size HxW (resize + center crop)");
  cmd->add_option("--layout", args->layout, "image folders: NCHW or NHWC")->check(CLI::IsMember(NamesOf(kLayoutNames)));
  cmd->add_option("--class-names", args->class_names, "class names, label order (comma-separated)")->delimiter(',');
  cmd->add_flag("--skip-corrupt", args->skip_corrupt,
                "image folders: leave out images that do not decode (named and counted) instead of failing");
  cmd->add_flag("--keep-encoded", args->keep_encoded, "image folders: store the JPEG files as they are (/jpeg)");
  cmd->add_option("--chunk-samples", args->chunk_samples, "samples per chunk (default: about 2 MiB a chunk)");
  cmd->add_option("--codec", args->codec,
                  "deflate (the default: any HDF5 reader decodes it), zstd (readers need a filter plugin) or none")
      ->check(CLI::IsMember(NamesOf(kCodecNames, /*aliases=*/true)))
      ->capture_default_str();
  cmd->add_option("--level", args->level, "compression level (default: deflate 4, zstd 3)");
  cmd->add_flag("--shuffle-filter", args->shuffle_filter,
                "apply HDF5's shuffle filter before compressing (the default for dtypes of 2 bytes or more)");
  cmd->add_flag("--no-shuffle-filter", args->no_shuffle_filter, "compress without the shuffle filter")
      ->excludes("--shuffle-filter");
  cmd->add_option("--threads", args->threads, "compression threads (default: all cores)");
  cmd->add_flag("--json", args->json, "print the summary as JSON");
  cmd->callback([args, exit_code, cmd] { *exit_code = RunConvert(*args, *cmd); });
}

}  // namespace gpufeed::cli
