// The enums an option, a flag, a file or a message spells by name, and their
// names: one table each, here (practice 21). Each enum's Name / FromName pair
// is made from its table, so the name a user types, the one a message prints
// and the one a state file or the wire carries are written once; no other
// file compares or switches on these names. DType's names are in dtype.h's
// table (common/dtype.cc) with its other facts.
#ifndef GPUFEED_NAMES_H_
#define GPUFEED_NAMES_H_

#include <cstddef>
#include <optional>
#include <span>
#include <string>
#include <string_view>

#include "gpufeed/status.h"

namespace gpufeed {

// --- the enums ---------------------------------------------------------------

// The order of an epoch's samples (LoaderOptions::order).
enum class Order {
  kSequential,  // 0, 1, 2, ...
  kRandom,      // a full permutation each epoch
  // Chunk-aware: shuffle the chunk order, then shuffle the samples of each
  // window of `shuffle_window` consecutive chunks together. Each chunk is read
  // and decoded once per epoch when the cache holds a window.
  kBlock,
};

// What an encoded image becomes (DecodeOptions::transform).
enum class ImageTransform {
  // torchvision RandomResizedCrop: a random box of area fraction in
  // [scale_min, scale_max] and aspect ratio in [ratio_min, ratio_max]
  // (log-uniform), 10 tries, else a center crop; a pure function of
  // (loader seed, epoch, sample).
  kRandomResizedCrop,
  // Evaluation: Resize(shorter side = min(height, width) / center_fraction),
  // then CenterCrop(height, width). Same every epoch.
  kCenterCrop,
};

// An image's axes: planar (channels first) or interleaved (channels last).
// A file's layout attribute and DecodeOptions::layout carry the name, which
// may be another (a file's "NCDHW"); LayoutFromName says which this is.
enum class Layout { kNCHW, kNHWC };

// How a dataset's chunks are read (DatasetInfo::read_path).
enum class ReadPath {
  kDirect,  // pread + our own filters, no HDF5 call per chunk
  kHdf5,    // H5Dread through HDF5's (tuned) chunk cache
};

// How the direct path reads chunk bytes from the file (OpenOptions::io).
enum class IoMode {
  // kDirect when the file is larger than the memory available to the page
  // cache (MemAvailable / the cgroup limit: common/memory.h), else kBuffered.
  kAuto,
  // O_DIRECT into block-aligned buffers (a chunk not aligned to 4 KiB is read
  // through its covering aligned range): the page cache is not filled with
  // the dataset, so the user's other cached data stays. Where the kernel or
  // the file system refuses O_DIRECT (some tmpfs, container runtimes), Open
  // falls back to kBuffered and says so once on stderr and in
  // DatasetInfo::io_note (shown by `gpufeed inspect`).
  kDirect,
  // pread through the page cache (the right choice when the data fits in
  // memory: a second epoch reads from RAM).
  kBuffered,
};

// A chunked dataset's compression (WriteOptions::codec).
enum class Codec { kNone, kDeflate, kZstd };

// What a local data spec names (gpufeed/local_source.h, DecideSourceKind).
enum class SourceKind {
  kFields,         // named fields (open.fields) or many files (IsMultiFileSpec): FieldSource
  kEncodedImages,  // an encoded image field (DetectEncoded): EncodedImageSource
  kDataset,        // an HDF5 dataset (a virtual one's sources read directly)
  kImageFolder,    // a directory: class folders of images, read as they are (an EncodedImageSource)
  // What `gpufeed convert` reads and the loader does not (gpufeed/convert.h):
  kNpy,        // a .npy file
  kIdx,        // any other file without HDF5's signature: MNIST's IDX format (or not a dataset at all)
  kNpyFields,  // named fields of .npy files, every one NAME=PATTERN.npy (or a .txt/.list of them), no spec
};

// Where JPEGs are decoded for a feed: kCpu in the loader's threads, kGpu by
// the GPU's decoder (LoaderOptions::defer_decode + the feed), kAuto: kGpu
// where GpuImageDecoder(device) is ok, the feed is on a GPU and the source
// holds encoded images, else kCpu (gpufeed/gpu_feed.h).
enum class DecodeDevice { kAuto, kCpu, kGpu };

// Where a file's batches are made when a job runs several ranks on one host
// (gpufeed/open_source.h says what each does).
enum class Share { kAuto, kNode, kNone };

// The trainer's model, optimizer and device (gpufeed/trainer.h). kAdamW8bit,
// kSgd8bit: the same updates with 8-bit states (blockwise dynamic
// quantization, tensors under 4,096 values in fp32): about a quarter of the
// optimizer's memory.
// kResnet18: torchvision's ResNet-18 layout (channels: its four stages').
enum class ModelKind { kMlp, kCnn, kResnet18 };
enum class Optimizer { kSgd, kAdamW, kAdamW8bit, kSgd8bit };
enum class TrainDevice { kAuto, kCpu, kCuda };

// --- the tables ----------------------------------------------------------------

template <typename E>
struct NameRow {
  E value;
  std::string_view name;
  std::string_view remark = {};  // said after the name where the names are listed: "auto (...)"
};
template <typename E>
struct NameAlias {
  std::string_view name;
  E value;
};

// An enum's names. `unknown` is the message for a name not in the table,
// "{name}" in it the name given, "{names}" the list of names ("a, b or c",
// each with its remark; `last` joins the last two).
template <typename E>
struct NameTable {
  std::span<const NameRow<E>> rows;
  std::span<const NameAlias<E>> aliases;
  std::string_view unknown;
  std::string_view last = " or ";

  // The value `text` names (a name or an alias), without a message.
  constexpr std::optional<E> Find(std::string_view text) const {
    for (const NameRow<E>& r : rows) {
      if (r.name == text) return r.value;
    }
    for (const NameAlias<E>& a : aliases) {
      if (a.name == text) return a.value;
    }
    return std::nullopt;
  }
  constexpr std::string_view Name(E value) const {
    for (const NameRow<E>& r : rows) {
      if (r.value == value) return r.name;
    }
    return "?";
  }
  std::string List() const {
    std::string out;
    for (size_t i = 0; i < rows.size(); ++i) {
      if (i > 0) out += i + 1 == rows.size() ? last : std::string_view(", ");
      out += rows[i].name;
      if (!rows[i].remark.empty()) out.append(" (").append(rows[i].remark).append(")");
    }
    return out;
  }
  Result<E> Parse(std::string_view text) const {
    if (const std::optional<E> v = Find(text)) return *v;
    std::string message(unknown);
    if (const size_t at = message.find("{names}"); at != std::string::npos) message.replace(at, 7, List());
    if (const size_t at = message.find("{name}"); at != std::string::npos) message.replace(at, 6, text);
    return Status::InvalidArgument(message);
  }
};

namespace names {
inline constexpr NameRow<Order> kOrder[] = {
    {Order::kSequential, "sequential"}, {Order::kRandom, "random"}, {Order::kBlock, "block"}};
inline constexpr NameRow<ImageTransform> kImageTransform[] = {
    {ImageTransform::kRandomResizedCrop, "random_resized_crop", "training"},
    {ImageTransform::kCenterCrop, "center_crop", "evaluation"}};
inline constexpr NameAlias<ImageTransform> kImageTransformAliases[] = {{"rrc", ImageTransform::kRandomResizedCrop},
                                                                       {"center", ImageTransform::kCenterCrop}};
inline constexpr NameRow<Layout> kLayout[] = {{Layout::kNCHW, "NCHW"}, {Layout::kNHWC, "NHWC"}};
inline constexpr NameRow<ReadPath> kReadPath[] = {{ReadPath::kDirect, "direct"}, {ReadPath::kHdf5, "hdf5"}};
inline constexpr NameRow<IoMode> kIoMode[] = {
    {IoMode::kAuto, "auto"}, {IoMode::kDirect, "direct"}, {IoMode::kBuffered, "buffered"}};
inline constexpr NameRow<Codec> kCodec[] = {
    {Codec::kNone, "none"}, {Codec::kDeflate, "deflate"}, {Codec::kZstd, "zstd"}};
inline constexpr NameAlias<Codec> kCodecAliases[] = {{"gzip", Codec::kDeflate}};
inline constexpr NameRow<SourceKind> kSourceKind[] = {
    {SourceKind::kFields, "fields"},        {SourceKind::kEncodedImages, "encoded images"},
    {SourceKind::kDataset, "dataset"},      {SourceKind::kImageFolder, "image folder"},
    {SourceKind::kNpy, ".npy file"},        {SourceKind::kIdx, "IDX file"},
    {SourceKind::kNpyFields, ".npy fields"}};
inline constexpr NameRow<DecodeDevice> kDecodeDevice[] = {
    {DecodeDevice::kAuto, "auto"}, {DecodeDevice::kCpu, "cpu"}, {DecodeDevice::kGpu, "gpu"}};
inline constexpr NameRow<Share> kShare[] = {
    {Share::kAuto, "auto", "one decode per node under torchrun"}, {Share::kNode, "node"}, {Share::kNone, "none"}};
inline constexpr NameRow<ModelKind> kModelKind[] = {
    {ModelKind::kMlp, "mlp"}, {ModelKind::kCnn, "cnn"}, {ModelKind::kResnet18, "resnet18"}};
inline constexpr NameRow<Optimizer> kOptimizer[] = {{Optimizer::kSgd, "sgd"},
                                                    {Optimizer::kAdamW, "adamw"},
                                                    {Optimizer::kAdamW8bit, "adamw8bit"},
                                                    {Optimizer::kSgd8bit, "sgd8bit"}};
inline constexpr NameRow<TrainDevice> kTrainDevice[] = {
    {TrainDevice::kAuto, "auto"}, {TrainDevice::kCpu, "cpu"}, {TrainDevice::kCuda, "cuda"}};
}  // namespace names

inline constexpr NameTable<Order> kOrderNames{names::kOrder, {}, "unknown order '{name}' (expected {names})"};
inline constexpr NameTable<ImageTransform> kImageTransformNames{names::kImageTransform, names::kImageTransformAliases,
                                                                "image transform '{name}' is not {names}"};
inline constexpr NameTable<Layout> kLayoutNames{names::kLayout, {}, "layout '{name}': {names}"};
inline constexpr NameTable<ReadPath> kReadPathNames{names::kReadPath, {}, "read path '{name}': {names}"};
inline constexpr NameTable<IoMode> kIoModeNames{names::kIoMode, {}, "I/O mode '{name}' is not one of {names}", ", "};
inline constexpr NameTable<Codec> kCodecNames{names::kCodec, names::kCodecAliases,
                                              "unknown codec '{name}' (expected {names})"};
inline constexpr NameTable<SourceKind> kSourceKindNames{names::kSourceKind, {}, "source kind '{name}': {names}"};
inline constexpr NameTable<DecodeDevice> kDecodeDeviceNames{names::kDecodeDevice, {}, "decode '{name}': {names}"};
inline constexpr NameTable<Share> kShareNames{names::kShare, {}, "share '{name}': {names}"};
inline constexpr NameTable<ModelKind> kModelKindNames{names::kModelKind, {}, "unknown model '{name}' ({names})"};
inline constexpr NameTable<Optimizer> kOptimizerNames{names::kOptimizer, {}, "unknown optimizer '{name}' ({names})"};
inline constexpr NameTable<TrainDevice> kTrainDeviceNames{names::kTrainDevice, {}, "device '{name}': {names}"};

// --- one Name / FromName pair an enum ------------------------------------------

inline std::string_view OrderName(Order o) { return kOrderNames.Name(o); }
inline Result<Order> OrderFromName(std::string_view name) { return kOrderNames.Parse(name); }
// "random_resized_crop" / "center_crop"; FromName also takes "rrc" and "center".
inline std::string_view ImageTransformName(ImageTransform t) { return kImageTransformNames.Name(t); }
inline Result<ImageTransform> ImageTransformFromName(std::string_view name) { return kImageTransformNames.Parse(name); }
inline std::string_view LayoutName(Layout l) { return kLayoutNames.Name(l); }
inline Result<Layout> LayoutFromName(std::string_view name) { return kLayoutNames.Parse(name); }
// The layout `name` names, else `otherwise` (a file's attribute may be "" or
// another, such as "NCDHW"; a checked option is one of the two).
inline Layout LayoutOr(std::string_view name, Layout otherwise) { return kLayoutNames.Find(name).value_or(otherwise); }
inline std::string_view ReadPathName(ReadPath p) { return kReadPathNames.Name(p); }
inline Result<ReadPath> ReadPathFromName(std::string_view name) { return kReadPathNames.Parse(name); }
inline std::string_view IoModeName(IoMode m) { return kIoModeNames.Name(m); }
inline Result<IoMode> ParseIoMode(std::string_view text) { return kIoModeNames.Parse(text); }
// "none", "deflate", "zstd"; FromName also takes "gzip".
inline std::string_view CodecName(Codec c) { return kCodecNames.Name(c); }
inline Result<Codec> CodecFromName(std::string_view name) { return kCodecNames.Parse(name); }
// For messages: "fields", "encoded images", "dataset", "image folder", ".npy file", ...
inline std::string_view SourceKindName(SourceKind k) { return kSourceKindNames.Name(k); }
inline Result<SourceKind> SourceKindFromName(std::string_view name) { return kSourceKindNames.Parse(name); }
inline std::string_view DecodeDeviceName(DecodeDevice d) { return kDecodeDeviceNames.Name(d); }
inline Result<DecodeDevice> DecodeDeviceFromName(std::string_view name) { return kDecodeDeviceNames.Parse(name); }
inline std::string_view ShareName(Share s) { return kShareNames.Name(s); }
inline Result<Share> ShareFromName(std::string_view name) { return kShareNames.Parse(name); }
inline std::string ModelKindName(ModelKind k) { return std::string(kModelKindNames.Name(k)); }
inline Result<ModelKind> ModelKindFromName(std::string_view name) { return kModelKindNames.Parse(name); }
inline std::string OptimizerName(Optimizer o) { return std::string(kOptimizerNames.Name(o)); }
inline Result<Optimizer> OptimizerFromName(std::string_view name) { return kOptimizerNames.Parse(name); }
inline std::string_view TrainDeviceName(TrainDevice d) { return kTrainDeviceNames.Name(d); }
inline Result<TrainDevice> TrainDeviceFromName(std::string_view name) { return kTrainDeviceNames.Parse(name); }

}  // namespace gpufeed

#endif  // GPUFEED_NAMES_H_
