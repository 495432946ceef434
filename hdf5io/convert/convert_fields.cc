// ConvertFields (convert.h): every named field of a ChunkSource (many HDF5
// files, .npy pairs) into one gpufeed file or shards, through the same
// read -> statistics -> compress -> ordered write pipeline as Convert.
#include <sys/stat.h>
#include <tbb/parallel_pipeline.h>
#include <tbb/task_arena.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <mutex>
#include <thread>

#include "common/first_error.h"
#include "gpufeed/convert.h"
#include "gpufeed/dataset.h"
#include "gpufeed/fields.h"
#include "hdf5io/convert/channel_stats.h"

namespace gpufeed {
namespace {

uint64_t FileSize(const std::string& path) {
  struct stat st;
  return ::stat(path.c_str(), &st) == 0 ? static_cast<uint64_t>(st.st_size) : 0;
}

std::string ShardPath(const std::string& out, uint64_t shard) {
  std::string base = out;
  if (base.size() > 3 && base.compare(base.size() - 3, 3, ".h5") == 0) base.resize(base.size() - 3);
  char suffix[32];
  std::snprintf(suffix, sizeof suffix, "-%05llu.h5", static_cast<unsigned long long>(shard));
  return base + suffix;
}

// Samples [first, first + count) of every field, each into its own buffer,
// from the source's read units (unit u holds samples [u * k, ...): every
// ChunkSource numbers them so).
Status ReadRange(const ChunkSource& src, const std::vector<FieldInfo>& fields, uint64_t first, uint64_t count,
                 std::vector<std::byte>* unit, std::vector<std::vector<std::byte>>* out) {
  const uint64_t k = src.chunk_samples();
  const uint64_t capacity_bytes = std::max(src.max_chunk_buffer_bytes(), k * src.sample_bytes());
  if (unit->size() < capacity_bytes) unit->resize(capacity_bytes);
  for (size_t j = 0; j < fields.size(); ++j) (*out)[j].resize(count * fields[j].sample_bytes);
  for (uint64_t u = first / k; u * k < first + count; ++u) {
    GPUFEED_RETURN_IF_ERROR(src.ReadChunk(u, std::span<std::byte>(unit->data(), capacity_bytes)));
    const uint64_t capacity = fields.size() == 1 ? src.samples_in_chunk(u) : k;
    const uint64_t lo = std::max(first, u * k), hi = std::min(first + count, u * k + src.samples_in_chunk(u));
    for (size_t j = 0; j < fields.size(); ++j) {
      const uint64_t sb = fields[j].sample_bytes;
      std::memcpy((*out)[j].data() + (lo - first) * sb, unit->data() + capacity * fields[j].offset + (lo - u * k) * sb,
                  (hi - lo) * sb);
    }
  }
  return Status::Ok();
}

// One output chunk (of one shard) in flight.
struct Work {
  uint64_t shard = 0, chunk = 0, samples = 0;
  std::vector<DatasetWriter::EncodedChunk> encoded;
  std::vector<stats::Accumulator> stats;
};

}  // namespace

// long: not split yet (issue 47, item 6): open, plan, write and verify of a multi-field conversion
Result<FieldConvertSummary> ConvertFields(const ChunkSource& source, const std::string& out_path,
                                          const FieldConvertOptions& options) {
  const auto t0 = std::chrono::steady_clock::now();
  const std::vector<FieldInfo> fields = source.fields();
  const uint64_t total = source.num_samples();
  const std::string what = "converting " + source.name();
  if (total == 0) return Status::InvalidArgument(what + ": no samples");
  if (source.decodes_samples()) return Status::Unsupported(what + ": encoded images are converted with --keep-encoded");
  if (!options.layouts.empty() && options.layouts.size() != fields.size()) {
    return Status::InvalidArgument(what + ": " + std::to_string(options.layouts.size()) + " layouts for " +
                                   std::to_string(fields.size()) + " fields");
  }
  std::vector<std::string> layouts = options.layouts;
  if (layouts.empty()) {
    const auto* fs = dynamic_cast<const FieldSource*>(&source);
    for (size_t j = 0; j < fields.size(); ++j) {
      const FieldInfo& f = fields[j];
      std::string layout;
      if (fs != nullptr && !f.path.empty()) {
        if (auto ds = fs->OpenField(j); ds.ok()) layout = ds->info().layout;
      }
      layouts.push_back(layout.empty() ? GuessLayout(f.sample_shape) : layout);
    }
  }
  // One chunking for every field: the largest field's (its chunk is what
  // the loader reads a unit by), within every shard.
  uint64_t largest = 0;
  for (const FieldInfo& f : fields) largest = std::max(largest, f.sample_bytes);
  const uint64_t sample_bytes = source.sample_bytes();
  uint64_t shard_samples = total;
  if (options.shard_bytes > 0) shard_samples = std::clamp<uint64_t>(options.shard_bytes / sample_bytes, 1, total);
  uint64_t k = options.convert.write.chunk_samples ? std::min(options.convert.write.chunk_samples, total)
                                                   : AutoChunkSamples(largest, total);
  if (shard_samples < total) {
    if (shard_samples >= k) {
      shard_samples -= shard_samples % k;  // whole chunks: the loader's units never straddle shards
    } else {
      k = shard_samples;
    }
  }
  const uint64_t n_shards = (total + shard_samples - 1) / shard_samples;
  auto shard_n = [&](uint64_t s) { return std::min(shard_samples, total - s * shard_samples); };
  auto shard_chunks = [&](uint64_t s) { return (shard_n(s) + k - 1) / k; };

  // An output that is one of the inputs would replace it: refused before
  // anything is written.
  if (const auto* fs = dynamic_cast<const FieldSource*>(&source); fs != nullptr) {
    for (uint64_t s = 0; s < n_shards; ++s) {
      const std::string path = options.shard_bytes > 0 ? ShardPath(out_path, s) : out_path;
      for (const std::string& in : fs->files()) {
        std::error_code ec;
        if (std::filesystem::equivalent(path, in, ec)) {
          return Status::InvalidArgument(what + ": the output " + path + " is one of the inputs; write elsewhere");
        }
      }
    }
  }
  // Every shard's temporary file is created now (so encoding knows each
  // one's edge chunk) and closed; a shard is reopened while it is written.
  FieldConvertSummary summary;
  std::vector<DatasetWriter> writers;
  for (uint64_t s = 0; s < n_shards; ++s) {
    const std::string path = options.shard_bytes > 0 ? ShardPath(out_path, s) : out_path;
    WriteOptions w = options.convert.write;
    w.chunk_samples = k;
    w.dataset_path = fields[0].path.empty() ? "/" + fields[0].name : fields[0].path;
    w.layout = layouts[0];
    auto writer = DatasetWriter::Create(path, fields[0].sample_shape, fields[0].dtype, shard_n(s), w);
    if (!writer.ok()) return writer.status().WithContext(what);
    for (size_t j = 1; j < fields.size(); ++j) {
      auto added = writer->AddDataset(fields[j].path.empty() ? "/" + fields[j].name : fields[j].path,
                                      fields[j].sample_shape, fields[j].dtype, layouts[j]);
      if (!added.ok()) return added.status().WithContext(what);
    }
    GPUFEED_RETURN_IF_ERROR(writer->Close());
    writers.push_back(std::move(*writer));
    summary.outputs.push_back(path);
  }

  std::vector<stats::Geometry> geom;
  std::vector<int> axes;  // the layout's channel axis, or the guess inspect --stats makes
  std::vector<bool> has_stats;
  std::vector<stats::Accumulator> totals;
  for (size_t j = 0; j < fields.size(); ++j) {
    bool guessed = false;
    axes.push_back(GuessChannelAxis(layouts[j], fields[j].sample_shape, &guessed));
    geom.push_back(stats::GeometryOf(fields[j].sample_shape, axes[j]));
    has_stats.push_back(stats::Accumulator::Supports(fields[j].dtype));
    totals.emplace_back(fields[j].dtype, geom[j]);
  }
  const int threads = options.convert.threads > 0 ? options.convert.threads
                                                  : static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
  FirstError first_error;  // the workers' first failure stops the others
  auto fail = [&](Status s) { first_error.Set(std::move(s)); };
  uint64_t next_shard = 0, next_chunk = 0, done = 0;
  try {
    tbb::task_arena arena(threads);
    arena.execute([&] {
      tbb::parallel_pipeline(
          static_cast<size_t>(threads) * 2,
          tbb::make_filter<void, std::shared_ptr<Work>>(tbb::filter_mode::serial_in_order,
                                                        [&](tbb::flow_control& fc) -> std::shared_ptr<Work> {
                                                          if (next_shard >= n_shards || first_error.failed()) {
                                                            fc.stop();
                                                            return nullptr;
                                                          }
                                                          auto w = std::make_shared<Work>();
                                                          w->shard = next_shard;
                                                          w->chunk = next_chunk;
                                                          w->samples =
                                                              std::min(k, shard_n(next_shard) - next_chunk * k);
                                                          if (++next_chunk == shard_chunks(next_shard)) {
                                                            next_chunk = 0;
                                                            ++next_shard;
                                                          }
                                                          return w;
                                                        }) &
              tbb::make_filter<std::shared_ptr<Work>, std::shared_ptr<Work>>(
                  tbb::filter_mode::parallel,
                  [&](std::shared_ptr<Work> w) {
                    if (first_error.failed()) return w;
                    try {
                      thread_local std::vector<std::byte> unit;
                      thread_local std::vector<std::vector<std::byte>> bufs;
                      bufs.resize(fields.size());
                      const uint64_t first = w->shard * shard_samples + w->chunk * k;
                      Status s = ReadRange(source, fields, first, w->samples, &unit, &bufs);
                      w->encoded.resize(fields.size());
                      for (size_t j = 0; s.ok() && j < fields.size(); ++j) {
                        if (has_stats[j]) {
                          w->stats.emplace_back(fields[j].dtype, geom[j]);
                          w->stats.back().Add(bufs[j].data(), w->samples);
                        } else {
                          w->stats.emplace_back();
                        }
                        s = writers[w->shard].EncodeChunk(w->chunk, bufs[j], &w->encoded[j], j);
                      }
                      if (!s.ok()) fail(std::move(s));
                    } catch (const std::exception& e) {
                      fail(Status::Internal(source.name() + ": chunk " + std::to_string(w->chunk) + " of shard " +
                                            std::to_string(w->shard) + ": " + e.what()));
                    }
                    return w;
                  }) &
              tbb::make_filter<std::shared_ptr<Work>, void>(
                  tbb::filter_mode::serial_in_order, [&](std::shared_ptr<Work> w) {
                    if (first_error.failed()) return;
                    DatasetWriter& writer = writers[w->shard];
                    for (size_t j = 0; j < fields.size(); ++j) {
                      Status s = writer.WriteChunk(w->chunk, w->encoded[j], j);
                      if (!s.ok()) return fail(std::move(s));
                      if (has_stats[j]) totals[j].Merge(w->stats[j]);  // in order: the same result every run
                    }
                    if (w->chunk + 1 == shard_chunks(w->shard)) {
                      if (Status s = writer.Close(); !s.ok()) return fail(std::move(s));
                    }
                    done += w->samples;
                    if (options.convert.progress) options.convert.progress(done, total);
                  }));
    });
  } catch (const std::exception& e) {
    return Status::Internal(what + ": " + e.what());
  }
  if (first_error.failed()) return first_error.Get().WithContext(what + " to " + out_path);
  // The whole dataset's statistics in every shard, then every shard renamed
  // into place: until here a failure leaves no output.
  for (size_t j = 0; j < fields.size(); ++j) {
    FieldStats fs;
    fs.name = fields[j].name;
    fs.path = fields[j].path.empty() ? "/" + fields[j].name : fields[j].path;
    fs.channel_axis = axes[j];
    fs.samples = total;
    if (has_stats[j]) fs.channels = totals[j].Result();
    summary.stats.push_back(std::move(fs));
  }
  for (DatasetWriter& w : writers) {
    for (size_t j = 0; j < fields.size(); ++j) {
      const FieldStats& fs = summary.stats[j];
      bool counted = !fs.channels.empty();
      for (const ChannelStats& c : fs.channels) counted = counted && c.count > 0;
      if (counted) GPUFEED_RETURN_IF_ERROR(w.WriteChannelStats(fs.means(), fs.stddevs(), j));
    }
    GPUFEED_RETURN_IF_ERROR(w.Close());
  }
  for (DatasetWriter& w : writers) GPUFEED_RETURN_IF_ERROR(w.Commit());
  summary.shard_samples = shard_samples;
  ConvertSummary& t = summary.totals;
  t.samples = total;
  t.chunk_samples = k;
  t.raw_bytes = total * sample_bytes;
  t.input_bytes = 0;
  for (uint64_t c = 0; c < source.num_chunks(); ++c) t.input_bytes += source.stored_chunk_bytes(c);
  for (const std::string& p : summary.outputs) t.output_bytes += FileSize(p);
  if (!summary.stats.empty()) {
    t.mean = summary.stats[0].means();
    t.stddev = summary.stats[0].stddevs();
  }
  t.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  return summary;
}

}  // namespace gpufeed
