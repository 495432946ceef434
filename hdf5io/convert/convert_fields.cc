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

// Each field's layout: the options' (one per field), else the one stored
// with it, else a guess from its shape.
Result<std::vector<std::string>> FieldLayouts(const ChunkSource& source, const std::vector<FieldInfo>& fields,
                                              const FieldConvertOptions& options, const std::string& what) {
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
  return layouts;
}

// How the samples are cut: one chunking for every field (k samples), and
// shards of shard_samples (whole chunks: the loader's units never straddle
// shards).
struct ShardPlan {
  uint64_t total = 0, k = 0, shard_samples = 0, n_shards = 0;
  uint64_t samples(uint64_t s) const { return std::min(shard_samples, total - s * shard_samples); }
  uint64_t chunks(uint64_t s) const { return (samples(s) + k - 1) / k; }
};

ShardPlan PlanShards(const ChunkSource& source, const std::vector<FieldInfo>& fields,
                     const FieldConvertOptions& options) {
  // One chunking for every field: the largest field's (its chunk is what
  // the loader reads a unit by), within every shard.
  ShardPlan plan;
  const uint64_t total = plan.total = source.num_samples();
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
  plan.k = k;
  plan.shard_samples = shard_samples;
  plan.n_shards = (total + shard_samples - 1) / shard_samples;
  return plan;
}

// An output that is one of the inputs would replace it: refused before
// anything is written.
Status CheckOutputsAreNotInputs(const ChunkSource& source, const ShardPlan& plan, const std::string& out_path,
                                const FieldConvertOptions& options, const std::string& what) {
  if (const auto* fs = dynamic_cast<const FieldSource*>(&source); fs != nullptr) {
    for (uint64_t s = 0; s < plan.n_shards; ++s) {
      const std::string path = options.shard_bytes > 0 ? ShardPath(out_path, s) : out_path;
      for (const std::string& in : fs->files()) {
        std::error_code ec;
        if (std::filesystem::equivalent(path, in, ec)) {
          return Status::InvalidArgument(what + ": the output " + path + " is one of the inputs; write elsewhere");
        }
      }
    }
  }
  return Status::Ok();
}

// Every shard's temporary file is created now (so encoding knows each
// one's edge chunk) and closed; a shard is reopened while it is written.
Status CreateShards(const std::vector<FieldInfo>& fields, const std::vector<std::string>& layouts,
                    const ShardPlan& plan, const std::string& out_path, const FieldConvertOptions& options,
                    const std::string& what, std::vector<DatasetWriter>* writers, std::vector<std::string>* outputs) {
  for (uint64_t s = 0; s < plan.n_shards; ++s) {
    const std::string path = options.shard_bytes > 0 ? ShardPath(out_path, s) : out_path;
    WriteOptions w = options.convert.write;
    w.chunk_samples = plan.k;
    w.dataset_path = fields[0].path.empty() ? "/" + fields[0].name : fields[0].path;
    w.layout = layouts[0];
    auto writer = DatasetWriter::Create(path, fields[0].sample_shape, fields[0].dtype, plan.samples(s), w);
    if (!writer.ok()) return writer.status().WithContext(what);
    for (size_t j = 1; j < fields.size(); ++j) {
      auto added = writer->AddDataset(fields[j].path.empty() ? "/" + fields[j].name : fields[j].path,
                                      fields[j].sample_shape, fields[j].dtype, layouts[j]);
      if (!added.ok()) return added.status().WithContext(what);
    }
    GPUFEED_RETURN_IF_ERROR(writer->Close());
    writers->push_back(std::move(*writer));
    outputs->push_back(path);
  }
  return Status::Ok();
}

// The whole dataset's statistics in every shard, then every shard renamed
// into place: until here a failure leaves no output.
Status CommitShards(const std::vector<FieldStats>& stats, std::vector<DatasetWriter>& writers) {
  for (DatasetWriter& w : writers) {
    for (size_t j = 0; j < stats.size(); ++j) {
      const FieldStats& fs = stats[j];
      bool counted = !fs.channels.empty();
      for (const ChannelStats& c : fs.channels) counted = counted && c.count > 0;
      if (counted) GPUFEED_RETURN_IF_ERROR(w.WriteChannelStats(fs.means(), fs.stddevs(), j));
    }
    GPUFEED_RETURN_IF_ERROR(w.Close());
  }
  for (DatasetWriter& w : writers) GPUFEED_RETURN_IF_ERROR(w.Commit());
  return Status::Ok();
}

// Every chunk of every shard read, its statistics taken and encoded in
// parallel, and written in order (the statistics merged in order: the same
// result every run).
Status WriteShards(const ChunkSource& source, const std::vector<FieldInfo>& fields, const ShardPlan& plan,
                   const std::vector<stats::Geometry>& geom, const std::vector<bool>& has_stats,
                   const FieldConvertOptions& options, const std::string& what, const std::string& out_path,
                   std::vector<DatasetWriter>& writers, std::vector<stats::Accumulator>& totals) {
  const int threads = options.convert.threads > 0 ? options.convert.threads
                                                  : static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
  FirstError first_error;  // the workers' first failure stops the others
  auto fail = [&](Status s) { first_error.Set(std::move(s)); };
  const uint64_t k = plan.k, shard_samples = plan.shard_samples, n_shards = plan.n_shards, total = plan.total;
  auto shard_n = [&](uint64_t s) { return plan.samples(s); };
  auto shard_chunks = [&](uint64_t s) { return plan.chunks(s); };
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
  return Status::Ok();
}

}  // namespace

Result<FieldConvertSummary> ConvertFields(const ChunkSource& source, const std::string& out_path,
                                          const FieldConvertOptions& options) {
  const auto t0 = std::chrono::steady_clock::now();
  const std::vector<FieldInfo> fields = source.fields();
  const uint64_t total = source.num_samples();
  const std::string what = "converting " + source.name();
  if (total == 0) return Status::InvalidArgument(what + ": no samples");
  if (source.decodes_samples()) return Status::Unsupported(what + ": encoded images are converted with --keep-encoded");
  auto layouts_or = FieldLayouts(source, fields, options, what);
  if (!layouts_or.ok()) return layouts_or.status();
  const std::vector<std::string>& layouts = *layouts_or;
  const ShardPlan plan = PlanShards(source, fields, options);
  const uint64_t sample_bytes = source.sample_bytes();
  GPUFEED_RETURN_IF_ERROR(CheckOutputsAreNotInputs(source, plan, out_path, options, what));
  FieldConvertSummary summary;
  std::vector<DatasetWriter> writers;
  GPUFEED_RETURN_IF_ERROR(CreateShards(fields, layouts, plan, out_path, options, what, &writers, &summary.outputs));

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
  GPUFEED_RETURN_IF_ERROR(WriteShards(source, fields, plan, geom, has_stats, options, what, out_path, writers, totals));
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
  GPUFEED_RETURN_IF_ERROR(CommitShards(summary.stats, writers));
  summary.shard_samples = plan.shard_samples;
  ConvertSummary& t = summary.totals;
  t.samples = total;
  t.chunk_samples = plan.k;
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
