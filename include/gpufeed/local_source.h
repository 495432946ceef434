// The door: what a local data spec ("file.h5", "file.h5:/path", a glob, a
// directory or a list of files, with or without named fields) names, decided
// in one place, and the source that reads it. Every command and API opens
// local data through it: OpenBatchSource (the C++, C and Python Loaders and
// the CLI's benchmarks), `gpufeed serve`'s datasets, `gpufeed train`,
// `gpufeed inspect` (--stats too), `gpufeed convert` (whose other inputs,
// .npy, IDX and named .npy fields, the door names too: the loader refuses
// them, saying to convert them) and the benchmarks' reference files. Who
// needs the decision before the source (to refuse options, or to check
// batches against the file) calls DecideSourceKind once and opens from it:
// the file is probed once.
#ifndef GPUFEED_LOCAL_SOURCE_H_
#define GPUFEED_LOCAL_SOURCE_H_

#include <memory>
#include <optional>
#include <string_view>
#include <string>

#include "gpufeed/chunk_source.h"
#include "gpufeed/dataset.h"
#include "gpufeed/decode_options.h"
#include "gpufeed/encoded.h"
#include "gpufeed/fields.h"
#include "gpufeed/names.h"
#include "gpufeed/status.h"

namespace gpufeed {

// SourceKind and its names, for messages ("fields", "encoded images",
// "dataset", "image folder", ...): gpufeed/names.h.

// The kind, and for one HDF5 file (kEncodedImages, kDataset) the spec
// through the forked probe (unless open.trust_files), once: what opens it
// next takes `probed` and does not probe again (FieldSource::Open probes
// each of its files itself; the other kinds are not HDF5 and not probed).
// Errors: NotFound for a missing file; Corrupt for a file named like HDF5
// (.h5, .hdf5, .hdf, .he5) without its signature, and the probe's (a file
// that crashes or hangs HDF5); HDF5's refusal to open the file.
struct SourceDecision {
  SourceKind kind = SourceKind::kDataset;
  OpenOptions open;                  // as given
  std::optional<ProbedSpec> probed;  // one file's spec, probed
};
Result<SourceDecision> DecideSourceKind(const std::string& spec, const OpenOptions& open);

// OK for what the loader reads (kFields, kEncodedImages, kDataset,
// kImageFolder); for what only `gpufeed convert` reads (.npy, IDX, named
// .npy fields: no probed spec), InvalidArgument naming the kind and the
// convert command that makes it HDF5.
Status RefuseConvertOnly(const std::string& spec, const SourceDecision& decided);

// A local spec opened as the source it names (DecideSourceKind):
//   - kFields: FieldSource;
//   - kEncodedImages: EncodedImageSource, decoded with `decode`;
//   - kImageFolder: an EncodedImageSource over the folder's files as they are
//     (storage kFolder), decoded with `decode`;
//   - kDataset: the Dataset, or for an HDF5 virtual dataset a FieldSource
//     over its sources (images, and labels when the file has them), read
//     directly without HDF5's lock.
// Exactly one member is set. Errors as FieldSource::Open, the probe,
// OpenEncodedImages and Dataset::Open.
struct LocalSource {
  std::unique_ptr<Dataset> dataset;
  std::unique_ptr<ChunkSource> fields;  // a FieldSource (named fields, many files, a virtual dataset's sources)
  std::unique_ptr<EncodedImageSource> encoded;
  // The source to read (whichever member is set).
  const ChunkSource* source() const {
    return dataset  ? static_cast<const ChunkSource*>(dataset.get())
           : fields ? fields.get()
                    : static_cast<const ChunkSource*>(encoded.get());
  }
};
Result<LocalSource> OpenLocalSource(const std::string& spec, const OpenOptions& open, const DecodeOptions& decode);
// As OpenLocalSource, for what DecideSourceKind(spec, ...) decided (its
// probed spec taken: the file is not probed again).
Result<LocalSource> OpenDecidedSource(const std::string& spec, const SourceDecision& decided,
                                      const DecodeOptions& decode);

// What the door decided, opened as named fields (a FieldSource): kFields as
// they are; one HDF5 dataset (kDataset) as the single field "images" (its
// probed spec taken: the file is not probed again). What reads fields of
// numbers (`gpufeed inspect --stats`) opens the spec so. Errors: those of
// FieldSource::Open; InvalidArgument naming the kind for encoded images, an
// image folder, .npy or IDX.
Result<std::unique_ptr<FieldSource>> OpenDecidedFields(const std::string& spec, const SourceDecision& decided);

// A local spec opened for a classifier (`gpufeed train`): as OpenLocalSource,
// and where that is a FieldSource (named fields, many files, a virtual
// dataset's sources) its "images" field is the samples and its "labels"
// field (one integer a sample, read once) the labels(): open.fields must
// name both (empty: images=/images, labels=/labels). Errors: those of
// OpenLocalSource; InvalidArgument for a missing images or labels field, or
// labels that are not one integer a sample (naming the field and its shape).
Result<std::unique_ptr<ChunkSource>> OpenClassifierSource(const std::string& spec, const OpenOptions& open,
                                                          const DecodeOptions& decode);

}  // namespace gpufeed

#endif  // GPUFEED_LOCAL_SOURCE_H_
