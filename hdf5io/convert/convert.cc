// Convert: the parallel read → statistics → compress → ordered write pipeline
// that turns any SampleSource into a gpufeed dataset, and OpenSource's choice
// of reader.
#include "gpufeed/convert.h"
#include "hdf5io/formats/image_folder_listing.h"

#include <sys/stat.h>
#include <tbb/global_control.h>
#include <tbb/parallel_pipeline.h>
#include <tbb/task_arena.h>
#include <zlib.h>

#include <atomic>
#include <chrono>
#include <cmath>
#include <cstring>
#include <fstream>
#include <mutex>
#include <thread>

#include "common/first_error.h"
#include "gpufeed/dataset.h"
#include "gpufeed/local_source.h"
#include "gpufeed/stats.h"
#include "hdf5io/convert/channel_stats.h"

namespace gpufeed {
namespace {

uint64_t FileSize(const std::string& path) {
  struct stat st;
  return ::stat(path.c_str(), &st) == 0 ? static_cast<uint64_t>(st.st_size) : 0;
}

// One chunk in flight through the pipeline.
struct Work {
  uint64_t index = 0;
  uint64_t samples = 0;
  DatasetWriter::EncodedChunk encoded;
  stats::Accumulator stats;
};

// The writer's options for `source`: the source's layout and class names
// where none were given (checked against its labels), and its own chunking
// where it has one of a sane size (at most kMaxKeptChunkBytes): each of its
// chunks is then decoded once.
Result<WriteOptions> WriteOptionsFor(const SampleSource& source, const ConvertOptions& options) {
  WriteOptions wopt = options.write;
  if (wopt.layout.empty()) wopt.layout = source.layout();
  if (wopt.class_names.empty()) wopt.class_names = source.class_names();
  if (!wopt.class_names.empty() && !source.labels().empty()) {
    const int64_t max_label = *std::max_element(source.labels().begin(), source.labels().end());
    if (max_label >= static_cast<int64_t>(wopt.class_names.size())) {
      return Status::InvalidArgument("converting " + source.description() + ": " +
                                     std::to_string(wopt.class_names.size()) + " class names (--class-names) for " +
                                     "labels up to " + std::to_string(max_label) + "; name all " +
                                     std::to_string(max_label + 1) + " classes, in label order");
    }
  }
  const uint64_t total = source.num_samples();
  if (wopt.chunk_samples == 0 && source.read_unit_samples() > 0) {
    constexpr uint64_t kMaxKeptChunkBytes = 64ull << 20;
    uint64_t sample_bytes = DTypeSize(source.dtype());
    for (uint64_t d : source.sample_shape()) sample_bytes *= d;
    const uint64_t unit = std::min(source.read_unit_samples(), std::max<uint64_t>(1, total));
    if (sample_bytes > 0 && unit <= kMaxKeptChunkBytes / sample_bytes) wopt.chunk_samples = unit;
  }
  return wopt;
}

// The per-channel statistics of the whole conversion into the summary, and
// into the file where every channel counted a value.
Status WriteStats(const stats::Accumulator& totals, DatasetWriter& writer, ConvertSummary* summary) {
  const std::vector<ChannelStats> channels = totals.Result();
  bool counted = true;
  for (const ChannelStats& c : channels) counted = counted && c.count > 0;
  for (const ChannelStats& c : channels) {
    summary->mean.push_back(c.mean);
    summary->stddev.push_back(c.stddev);
  }
  if (counted) {
    GPUFEED_RETURN_IF_ERROR(writer.WriteChannelStats(summary->mean, summary->stddev));
  } else {
    summary->mean.clear();
    summary->stddev.clear();
  }
  return Status::Ok();
}

}  // namespace

Result<ConvertSummary> Convert(const SampleSource& source, const std::string& out_path, const ConvertOptions& options) {
  const auto t0 = std::chrono::steady_clock::now();
  auto wopt_or = WriteOptionsFor(source, options);
  if (!wopt_or.ok()) return wopt_or.status();
  const WriteOptions& wopt = *wopt_or;
  const uint64_t total = source.num_samples();
  auto writer_or = DatasetWriter::Create(out_path, source.sample_shape(), source.dtype(), total, wopt);
  if (!writer_or.ok()) return writer_or.status().WithContext("converting " + source.description());
  DatasetWriter& writer = *writer_or;

  const uint64_t k = writer.chunk_samples();
  const uint64_t sb = writer.sample_bytes();
  const uint64_t n_chunks = writer.num_chunks();
  // Statistics per channel where the layout names the channel axis, else
  // one value for the whole sample (the shared implementation: stats.h).
  const int channel_axis = ChannelAxisFromLayout(wopt.layout, source.sample_shape().size());
  const stats::Geometry geom = stats::GeometryOf(source.sample_shape(), channel_axis);
  const bool have_stats = stats::Accumulator::Supports(source.dtype());
  const int threads =
      options.threads > 0 ? options.threads : static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));

  FirstError first_error;  // the workers' first failure stops the others
  auto fail = [&](Status s) { first_error.Set(std::move(s)); };

  stats::Accumulator totals(source.dtype(), geom);
  uint64_t next = 0, done = 0;

  tbb::task_arena arena(threads);
  arena.execute([&] {
    tbb::parallel_pipeline(
        static_cast<size_t>(threads) * 2,
        tbb::make_filter<void, uint64_t>(tbb::filter_mode::serial_in_order,
                                         [&](tbb::flow_control& fc) -> uint64_t {
                                           if (next >= n_chunks || first_error.failed()) {
                                             fc.stop();
                                             return 0;
                                           }
                                           return next++;
                                         }) &
            tbb::make_filter<uint64_t, std::shared_ptr<Work>>(
                tbb::filter_mode::parallel,
                [&](uint64_t i) -> std::shared_ptr<Work> {
                  auto w = std::make_shared<Work>();
                  w->index = i;
                  w->samples = std::min(k, total - i * k);
                  if (first_error.failed()) return w;
                  thread_local std::vector<std::byte> buf;
                  buf.resize(w->samples * sb);
                  try {
                    Status s = source.Read(i * k, w->samples, buf);
                    if (s.ok()) {
                      if (have_stats) {
                        w->stats = stats::Accumulator(source.dtype(), geom);
                        w->stats.Add(buf.data(), w->samples);
                      }
                      s = writer.EncodeChunk(i, buf, &w->encoded);
                    }
                    if (!s.ok()) fail(std::move(s));
                  } catch (const std::exception& e) {
                    fail(Status::Internal(source.description() + ": chunk " + std::to_string(i) + ": " + e.what()));
                  }
                  return w;
                }) &
            tbb::make_filter<std::shared_ptr<Work>, void>(tbb::filter_mode::serial_in_order,
                                                          [&](std::shared_ptr<Work> w) {
                                                            if (first_error.failed()) return;
                                                            Status s = writer.WriteChunk(w->index, w->encoded);
                                                            if (!s.ok()) {
                                                              fail(std::move(s));
                                                              return;
                                                            }
                                                            if (have_stats) totals.Merge(w->stats);  // in order
                                                            done += w->samples;
                                                            if (options.progress) options.progress(done, total);
                                                          }));
  });
  if (first_error.failed())
    return first_error.Get().WithContext("converting " + source.description() + " to " + out_path);

  if (!source.labels().empty()) {
    GPUFEED_RETURN_IF_ERROR(writer.WriteLabels(source.labels()));
  }
  ConvertSummary summary;
  if (have_stats) GPUFEED_RETURN_IF_ERROR(WriteStats(totals, writer, &summary));
  GPUFEED_RETURN_IF_ERROR(writer.Commit());
  summary.samples = total;
  summary.chunk_samples = k;
  summary.input_bytes = source.input_bytes();
  summary.raw_bytes = total * sb;
  summary.output_bytes = FileSize(out_path);
  summary.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  return summary;
}

// ---------------------------------------------------------------------------
// HDF5 input: rechunk / recompress an existing dataset.

namespace {

class Hdf5Source final : public SampleSource {
 public:
  explicit Hdf5Source(Dataset ds) : ds_(std::move(ds)) {
    layout_ = ds_.info().layout;
    if (layout_.empty()) layout_ = GuessLayout(ds_.sample_shape());
  }
  uint64_t num_samples() const override { return ds_.num_samples(); }
  const std::vector<uint64_t>& sample_shape() const override { return ds_.sample_shape(); }
  DType dtype() const override { return ds_.dtype(); }
  std::string layout() const override { return layout_; }
  std::vector<std::string> class_names() const override { return ds_.info().class_names; }
  const std::vector<int64_t>& labels() const override { return ds_.labels(); }
  uint64_t input_bytes() const override { return ds_.info().stored_bytes; }
  std::string description() const override { return ds_.info().file + ":" + ds_.info().images_path; }
  Status Read(uint64_t first, uint64_t count, std::span<std::byte> dst) const override {
    return ds_.ReadSamples(first, count, dst);
  }
  uint64_t read_unit_samples() const override { return ds_.chunk_samples(); }

 private:
  Dataset ds_;
  std::string layout_;
};

}  // namespace

namespace {

// The door's dataset (decided, and probed once) as what convert reads.
Result<std::unique_ptr<SampleSource>> OpenDecidedHdf5(const std::string& spec, const SourceDecision& decided) {
  switch (decided.kind) {
    case SourceKind::kDataset:
      break;
    case SourceKind::kEncodedImages:
      return Status::Unsupported(spec +
                                 ": encoded images (JPEG/PNG files) are already in gpufeed's format: the loader "
                                 "reads and decodes them (gpufeed/encoded.h); convert reads decoded datasets");
    default:
      return Status::InvalidArgument(spec + ": " + std::string(SourceKindName(decided.kind)) +
                                     ", not one HDF5 dataset (many files and named fields: gpufeed convert --field)");
  }
  if (!decided.probed) return Status::Internal(spec + ": the door decided one file without probing it");
  auto ds = Dataset::Open(*decided.probed, decided.open);
  if (!ds.ok()) return ds.status();
  return std::unique_ptr<SampleSource>(std::make_unique<Hdf5Source>(std::move(*ds)));
}

}  // namespace

Result<std::unique_ptr<SampleSource>> OpenHdf5Source(const std::string& spec, const std::string& labels_path) {
  OpenOptions o;
  o.labels_path = labels_path;
  auto decided = DecideSourceKind(spec, o);
  if (!decided.ok()) return decided.status();
  return OpenDecidedHdf5(spec, *decided);
}

Result<std::unique_ptr<SampleSource>> OpenSource(const std::string& input, const std::string& labels_path,
                                                 const ImageFolderOptions& image_options) {
  // The door decides what the input is (gpufeed/local_source.h), as for
  // every other command; an HDF5 file is probed there, once.
  OpenOptions o;
  o.labels_path = labels_path;
  auto decided = DecideSourceKind(input, o);
  if (!decided.ok()) return decided.status();
  return OpenSource(input, *decided, image_options);
}

Result<std::unique_ptr<SampleSource>> OpenSource(const std::string& input, const SourceDecision& decided,
                                                 const ImageFolderOptions& image_options) {
  const std::string& labels_path = decided.open.labels_path;
  switch (decided.kind) {
    case SourceKind::kImageFolder:
      if (image_options.height == 0 || image_options.width == 0) {
        // An empty folder is said as such, before the missing size.
        auto listed = image_folder::ListImageFolder(input);
        if (!listed.ok()) return listed.status();
        return Status::InvalidArgument(input +
                                       ": converting an image folder needs --size HxW (the images are decoded and "
                                       "resized to it), or --keep-encoded (the files stored as they are, decoded by "
                                       "the loader)");
      }
      return OpenImageFolderSource(input, image_options);
    case SourceKind::kNpy:
      return OpenNpySource(input, labels_path);
    case SourceKind::kIdx:
      return OpenIdxSource(input, labels_path);
    default:
      return OpenDecidedHdf5(input, decided);
  }
}

}  // namespace gpufeed
