// HDF5 virtual datasets (hdf5io/hdf5/virtual.h): the mapping read with HDF5's
// H5Pget_virtual_* calls, checked as hostile input (every selection against
// its extent, every sum for overflow), resolved to files and sources.
#include "hdf5io/hdf5/virtual.h"

#include <sys/stat.h>

#include <algorithm>
#include <cstdlib>
#include <filesystem>
#include <string_view>

#include "common/sizes.h"
#include "hdf5io/hdf5/h5_util.h"

namespace gpufeed::h5 {
namespace {

// HDF5 holds the names in memory already; longer than this is not a path.
constexpr ssize_t kMaxNameBytes = 1 << 16;

std::string RangeText(uint64_t a, uint64_t b) { return "[" + std::to_string(a) + ", " + std::to_string(b) + ")"; }

std::string ShapeText(const std::vector<uint64_t>& shape) {
  std::string s = "[";
  for (size_t i = 0; i < shape.size(); ++i) s += (i ? ", " : "") + std::to_string(shape[i]);
  return s + "]";
}

// A selection that is one solid box: its start and length per dimension,
// and the extent of the dataspace it selects from.
struct Box {
  std::vector<uint64_t> start, len, extent;
};

std::string BoxText(const Box& b) {
  std::string s = "[";
  for (size_t k = 0; k < b.start.size(); ++k) {
    s += (k ? ", " : "") + std::to_string(b.start[k]) + ":" + std::to_string(b.start[k] + b.len[k]);
  }
  return s + "] of " + ShapeText(b.extent);
}

// The box `space` selects, or Unsupported for what is not one box (points,
// unions, strides, unlimited blocks), Corrupt for a box outside the extent.
Result<Box> SolidBox(hid_t space, const std::string& which) {
  const int rank = H5Sget_simple_extent_ndims(space);
  if (rank < 0 || rank > H5S_MAX_RANK) return Status::Corrupt(which + ": unreadable dataspace: " + LastErrorText());
  std::vector<hsize_t> dims(rank);
  if (rank > 0 && H5Sget_simple_extent_dims(space, dims.data(), nullptr) < 0) {
    return Status::Corrupt(which + ": unreadable dataspace: " + LastErrorText());
  }
  Box b;
  b.extent.assign(dims.begin(), dims.end());
  b.start.assign(rank, 0);
  b.len = b.extent;
  switch (H5Sget_select_type(space)) {
    case H5S_SEL_ALL:
      return b;
    case H5S_SEL_HYPERSLABS:
      break;
    case H5S_SEL_POINTS:
      return Status::Unsupported(which + " selects points, not a box");
    case H5S_SEL_NONE:
      return Status::Unsupported(which + " selects nothing");
    default:
      return Status::Corrupt(which + ": unreadable selection: " + LastErrorText());
  }
  const htri_t regular = H5Sis_regular_hyperslab(space);
  if (regular <= 0) {
    H5Eclear2(H5E_DEFAULT);
    return Status::Unsupported(which + " is an irregular hyperslab (a union of blocks), not one box");
  }
  std::vector<hsize_t> start(rank), stride(rank), count(rank), block(rank);
  if (H5Sget_regular_hyperslab(space, start.data(), stride.data(), count.data(), block.data()) < 0) {
    return Status::Corrupt(which + ": unreadable hyperslab: " + LastErrorText());
  }
  for (int k = 0; k < rank; ++k) {
    const std::string axis = " along axis " + std::to_string(k);
    if (count[k] == H5S_UNLIMITED || block[k] == H5S_UNLIMITED) {
      return Status::Unsupported(which + " is unlimited" + axis + " (a dataset that grows with its sources)");
    }
    if (count[k] > 1 && stride[k] != block[k]) {
      return Status::Unsupported(which + " is strided" + axis + " (start " + std::to_string(start[k]) + ", stride " +
                                 std::to_string(stride[k]) + ", count " + std::to_string(count[k]) + ", block " +
                                 std::to_string(block[k]) + ")");
    }
    const auto len = CheckedMul(count[k], block[k]);
    const auto end = len ? CheckedAdd(start[k], *len) : std::nullopt;
    if (!end || *end > dims[k]) {
      return Status::Corrupt(which + ": hyperslab" + axis + " (start " + std::to_string(start[k]) + ", count " +
                             std::to_string(count[k]) + ", block " + std::to_string(block[k]) +
                             ") lies outside the extent " + ShapeText(b.extent));
    }
    b.start[k] = start[k];
    b.len[k] = *len;
  }
  return b;
}

// Mapping i's source file or dataset name (a getter of H5Pget_virtual_*'s shape).
template <typename Getter>
Result<std::string> MappingName(Getter get, hid_t dcpl, size_t i, const std::string& which) {
  const ssize_t n = get(dcpl, i, nullptr, 0);
  if (n < 0 || n > kMaxNameBytes) return Status::Corrupt(which + ": unreadable source name: " + LastErrorText());
  std::string s(static_cast<size_t>(n) + 1, '\0');
  if (get(dcpl, i, s.data(), s.size()) < 0) {
    return Status::Corrupt(which + ": unreadable source name: " + LastErrorText());
  }
  s.resize(static_cast<size_t>(n));
  return s;
}

// HDF5 expands "%b" (a block number: printf-style names of unlimited
// mappings) and "%%" (a percent sign) in source names.
Result<std::string> UnescapeName(const std::string& name, const std::string& which) {
  std::string out;
  for (size_t i = 0; i < name.size(); ++i) {
    if (name[i] == '%' && i + 1 < name.size() && name[i + 1] == '%') {
      out += '%';
      ++i;
    } else if (name[i] == '%' && i + 1 < name.size() && name[i + 1] == 'b') {
      return Status::Unsupported(which + ": the source name '" + name +
                                 "' is printf-style (%b: one source per block of an unlimited mapping)");
    } else {
      out += name[i];
    }
  }
  return out;
}

bool IsFile(const std::string& p) {
  struct stat st;
  return ::stat(p.c_str(), &st) == 0 && !S_ISDIR(st.st_mode);
}

std::string TypeText(hid_t t) {
  const size_t size = H5Tget_size(t);
  switch (H5Tget_class(t)) {
    case H5T_INTEGER:
      return std::string(H5Tget_sign(t) == H5T_SGN_2 ? "int" : "uint") + std::to_string(8 * size) +
             (H5Tget_order(t) == H5T_ORDER_BE ? " big-endian" : "");
    case H5T_FLOAT:
      return "float" + std::to_string(8 * size) + (H5Tget_order(t) == H5T_ORDER_BE ? " big-endian" : "");
    case H5T_ENUM:
      return "enum of " + std::to_string(size) + " bytes";
    default:
      return "a non-numeric type of " + std::to_string(size) + " bytes";
  }
}

// Opens source s and checks that it holds what the mapping says: the
// virtual dataset's type, its sample shape, the samples mapped. `whole`:
// the mapping selects all of the source (HDF5 keeps no extent for that), so
// its rank decides whether it is a run of samples or one stacked sample.
Status CheckSource(VirtualSource& s, bool whole, hid_t ftype, const std::vector<uint64_t>& dims,
                   const std::string& what) {
  const std::string where = "source " + DescribeVirtualSource(s) + " of " + what;
  h5::Id file(H5Fopen(s.file.c_str(), H5F_ACC_RDONLY, H5P_DEFAULT));
  if (!file.valid()) return Status::Corrupt(where + ": HDF5 cannot open the file: " + LastErrorText());
  if (H5Lexists(file.get(), s.dataset.c_str(), H5P_DEFAULT) <= 0 ||
      H5Oexists_by_name(file.get(), s.dataset.c_str(), H5P_DEFAULT) <= 0) {
    H5Eclear2(H5E_DEFAULT);
    return Status::NotFound(where + ": " + s.file + " has no dataset " + s.dataset +
                            " (HDF5 would read the fill value there; gpufeed does not invent samples)");
  }
  h5::Id dset(H5Dopen2(file.get(), s.dataset.c_str(), H5P_DEFAULT));
  if (!dset.valid()) return Status::InvalidArgument(where + ": not a dataset: " + LastErrorText());
  h5::Id dcpl(H5Dget_create_plist(dset.get()));
  if (H5Pget_layout(dcpl.get()) == H5D_VIRTUAL) {
    return Status::Unsupported(where +
                               ": the source is itself a virtual dataset (nested virtual datasets are not "
                               "resolved; point the mapping at the data)");
  }
  h5::Id type(H5Dget_type(dset.get()));
  if (H5Tequal(type.get(), ftype) <= 0) {
    H5Eclear2(H5E_DEFAULT);
    return Status::InvalidArgument(where + ": the source is " + TypeText(type.get()) + ", the virtual dataset " +
                                   TypeText(ftype) + " (HDF5 would convert; gpufeed reads sources of the same type)");
  }
  h5::Id space(H5Dget_space(dset.get()));
  const int rank = H5Sget_simple_extent_ndims(space.get());
  if (rank < 0 || rank > H5S_MAX_RANK) return Status::Corrupt(where + ": unreadable dataspace: " + LastErrorText());
  std::vector<hsize_t> sd(rank);
  if (rank > 0) H5Sget_simple_extent_dims(space.get(), sd.data(), nullptr);
  const std::vector<uint64_t> sdims(sd.begin(), sd.end());
  const std::vector<uint64_t> sample(dims.begin() + 1, dims.end());
  if (whole && s.count == 1 && sdims == sample) s.stacked = true;  // one sample without a sample axis
  bool ok = false;
  std::string need;
  if (s.stacked) {  // the source is one sample
    ok = sdims == sample;
    need = ShapeText(sample);
  } else {  // the mapped rows, each one sample (all of them when the mapping takes the whole source)
    const uint64_t rows = s.source_first + s.count;  // no overflow: checked against the srcspace extent
    ok = sdims.size() == dims.size() && (whole ? sdims[0] == rows : sdims[0] >= rows) &&
         std::equal(sample.begin(), sample.end(), sdims.begin() + 1);
    need = (whole ? "" : ">= ") + std::to_string(rows) + " samples of " + ShapeText(sample) +
           (whole ? " (the whole source)" : "");
  }
  if (!ok) {
    return Status::InvalidArgument(where + ": the source's shape is " + ShapeText(sdims) + ", the mapping needs " +
                                   need);
  }
  return Status::Ok();
}

}  // namespace

std::string DescribeVirtualSource(const VirtualSource& s) {
  return s.file + ":" + s.dataset +
         (s.stacked ? " (whole)" : " " + RangeText(s.source_first, s.source_first + s.count)) + " -> samples " +
         RangeText(s.first, s.first + s.count);
}

std::vector<std::string> VirtualSourceCandidates(const std::string& name, const std::string& vds_file) {
  namespace fs = std::filesystem;
  if (name == ".") return {vds_file};
  const fs::path p(name);
  const fs::path dir = fs::path(vds_file).parent_path();
  std::vector<std::string> out;
  if (p.is_absolute()) out.push_back(p.string());
  // An absolute name that is not there is looked for by its base name.
  const fs::path rel = p.is_absolute() ? p.filename() : p;
  if (const char* env = std::getenv("HDF5_VDS_PREFIX"); env != nullptr && env[0] != '\0') {
    std::string_view list(env);
    while (!list.empty()) {
      const size_t colon = list.find(':');
      std::string prefix(list.substr(0, colon));
      list = colon == std::string_view::npos ? std::string_view() : list.substr(colon + 1);
      if (prefix.empty()) continue;
      if (const size_t o = prefix.find("${ORIGIN}"); o != std::string::npos) {
        prefix.replace(o, 9, dir.empty() ? "." : dir.string());
      }
      out.push_back((fs::path(prefix) / rel).string());
    }
  }
  if (!dir.empty()) out.push_back((dir / rel).string());
  out.push_back(rel.string());
  return out;
}

Result<std::string> ResolveVirtualSourceFile(const std::string& name, const std::string& vds_file,
                                             const std::string& what) {
  const std::vector<std::string> tried = VirtualSourceCandidates(name, vds_file);
  for (const std::string& c : tried) {
    if (name == "." || IsFile(c)) return c;
  }
  std::string list;
  for (const std::string& t : tried) list += (list.empty() ? "" : ", ") + t;
  return Status::NotFound(what + ": source file '" + name + "' of the virtual dataset not found (tried " + list +
                          "); HDF5 would read its samples as the fill value, gpufeed refuses. Restore the file, or "
                          "point HDF5_VDS_PREFIX at its directory");
}

namespace {

const char kVirtualHint[] =
    "; gpufeed reads virtual datasets whose sources each cover a range of axis 0 and every other axis whole "
    "(what h5py's VirtualLayout builds when it stacks or concatenates files along axis 0)";

// Mapping `which`'s source selection `sb` against its virtual box `vb`: a
// range of axis 0 with every other axis whole (s->source_first), one whole
// source as one sample (s->stacked), or all of the source (*all: its own
// shape decides, CheckSource); anything else is refused.
Status MapSourceBox(hid_t sspace, const Box& vb, const Box& sb, const std::vector<uint64_t>& dims,
                    const std::string& which, VirtualSource* s, bool* all) {
  const std::string hint = kVirtualHint;
  const size_t vrank = dims.size();
  const size_t srank = sb.start.size();
  bool whole_others = true;
  *all = H5Sget_select_type(sspace) == H5S_SEL_ALL;
  if (*all) {
    // HDF5 keeps no extent for an "all" source selection: the source's own
    // shape decides (CheckSource).
  } else if (srank == vrank) {
    for (size_t k = 1; k < vrank; ++k) {
      whole_others = whole_others && sb.start[k] == 0 && sb.len[k] == dims[k] && sb.extent[k] == dims[k];
    }
    if (!whole_others || sb.len[0] != vb.len[0]) {
      return Status::Unsupported(which + " maps the source box " + BoxText(sb) + " to the virtual box " + BoxText(vb) +
                                 hint);
    }
    s->source_first = sb.start[0];
  } else if (srank + 1 == vrank && vb.len[0] == 1) {
    for (size_t k = 0; k < srank; ++k) {
      whole_others = whole_others && sb.start[k] == 0 && sb.len[k] == dims[k + 1] && sb.extent[k] == dims[k + 1];
    }
    if (!whole_others) {
      return Status::Unsupported(which + " maps the source box " + BoxText(sb) + " to the virtual sample " +
                                 BoxText(vb) + ": not the whole source" + hint);
    }
    s->stacked = true;
  } else {
    return Status::Unsupported(which + " maps the source box " + BoxText(sb) + " (rank " + std::to_string(srank) +
                               ") to the virtual box " + BoxText(vb) + " (rank " + std::to_string(vrank) + ")" + hint);
  }
  return Status::Ok();
}

// Mapping i of n of the virtual dataset: its names, its two selections,
// and its source file found.
Result<VirtualSource> ResolveMapping(hid_t dcpl, size_t i, size_t n, const std::vector<uint64_t>& dims,
                                     const std::string& vds_file, const std::string& what, bool* all) {
  const std::string hint = kVirtualHint;
  const size_t vrank = dims.size();
  std::string which = what + ": mapping " + std::to_string(i) + " of " + std::to_string(n);
  auto fname = MappingName(H5Pget_virtual_filename, dcpl, i, which);
  if (!fname.ok()) return fname.status();
  auto dname = MappingName(H5Pget_virtual_dsetname, dcpl, i, which);
  if (!dname.ok()) return dname.status();
  which += " (" + *fname + ":" + *dname + ")";
  auto file_name = UnescapeName(*fname, which);
  if (!file_name.ok()) return Status(file_name.status().code(), file_name.status().message() + hint);
  auto dset_name = UnescapeName(*dname, which);
  if (!dset_name.ok()) return dset_name.status();
  h5::Id vspace(H5Pget_virtual_vspace(dcpl, i));
  h5::Id sspace(H5Pget_virtual_srcspace(dcpl, i));
  if (!vspace.valid() || !sspace.valid()) return Status::Corrupt(which + ": unreadable selection: " + LastErrorText());
  auto vb = SolidBox(vspace.get(), which + ": the virtual selection");
  if (!vb.ok()) return Status(vb.status().code(), vb.status().message() + hint);
  auto sb = SolidBox(sspace.get(), which + ": the source selection");
  if (!sb.ok()) return Status(sb.status().code(), sb.status().message() + hint);
  if (vb->start.size() != vrank) {
    return Status::Corrupt(which + ": the virtual selection has rank " + std::to_string(vb->start.size()) +
                           ", the dataset " + std::to_string(vrank));
  }
  for (size_t k = 1; k < vrank; ++k) {
    if (vb->start[k] != 0 || vb->len[k] != dims[k]) {
      return Status::Unsupported(which + " maps the virtual box " + BoxText(*vb) + ": part of axis " +
                                 std::to_string(k) + hint);
    }
  }
  if (vb->len[0] == 0) return Status::Unsupported(which + " maps no sample (virtual box " + BoxText(*vb) + ")");
  VirtualSource s;
  s.file = std::string();
  s.dataset = dset_name->empty() || (*dset_name)[0] != '/' ? "/" + *dset_name : *dset_name;
  s.first = vb->start[0];
  s.count = vb->len[0];
  GPUFEED_RETURN_IF_ERROR(MapSourceBox(sspace.get(), *vb, *sb, dims, which, &s, all));
  auto file = ResolveVirtualSourceFile(*file_name, vds_file, which);
  if (!file.ok()) return file.status();
  s.file = std::move(*file);
  return s;
}

// The mappings, sorted by their first sample, cover samples [0, samples)
// once each: no gap (HDF5's fill value), no overlap.
Status CheckMappingsCover(std::vector<VirtualSource>& out, uint64_t samples, const std::string& what) {
  const std::string hint = kVirtualHint;
  std::sort(out.begin(), out.end(), [](const VirtualSource& a, const VirtualSource& b) { return a.first < b.first; });
  uint64_t next = 0;
  for (size_t i = 0; i < out.size(); ++i) {
    const VirtualSource& s = out[i];
    if (s.first > next) {
      return Status::InvalidArgument(what + ": samples " + RangeText(next, s.first) +
                                     " of the virtual dataset are mapped from no source (a gap before " +
                                     DescribeVirtualSource(s) +
                                     "); HDF5 would read the fill value there, gpufeed does not invent samples");
    }
    if (s.first < next) {
      return Status::Unsupported(what + ": " + DescribeVirtualSource(s) + " overlaps " +
                                 DescribeVirtualSource(out[i - 1]) + " (HDF5 reads the later mapping there)" + hint);
    }
    next = s.first + s.count;  // no overflow: both within the virtual selection's extent
  }
  if (next > samples) {
    return Status::Corrupt(what + ": " + DescribeVirtualSource(out.back()) + " maps samples beyond the dataset's " +
                           std::to_string(samples));
  }
  if (next < samples) {
    return Status::InvalidArgument(
        what + ": samples " + RangeText(next, samples) +
        " of the virtual dataset are mapped from no source (a gap at the end" +
        (out.empty() ? ", no mapping at all" : ", after " + DescribeVirtualSource(out.back())) +
        "); HDF5 would read the fill value there, gpufeed does not invent samples");
  }
  return Status::Ok();
}

}  // namespace

Result<std::vector<VirtualSource>> ResolveVirtualSources(hid_t dcpl, hid_t ftype, const std::vector<uint64_t>& dims,
                                                         const std::string& vds_file, const std::string& what) {
  size_t n = 0;
  if (dims.empty()) return Status::Unsupported(what + ": a scalar virtual dataset; expected [N, ...] samples");
  if (H5Pget_virtual_count(dcpl, &n) < 0) {
    return Status::Corrupt(what + ": the virtual dataset's mappings are unreadable: " + LastErrorText());
  }
  const uint64_t samples = dims[0];
  std::vector<VirtualSource> out;
  std::vector<std::pair<uint64_t, bool>> whole;  // (first, the mapping selects the whole source)
  out.reserve(std::min<uint64_t>(n, samples));   // more mappings than samples fail below, unreserved
  for (size_t i = 0; i < n; ++i) {
    bool all = false;
    auto s = ResolveMapping(dcpl, i, n, dims, vds_file, what, &all);
    if (!s.ok()) return s.status();
    whole.emplace_back(s->first, all);
    out.push_back(std::move(*s));
  }
  GPUFEED_RETURN_IF_ERROR(CheckMappingsCover(out, samples, what));
  std::sort(whole.begin(), whole.end());
  for (size_t i = 0; i < out.size(); ++i)
    GPUFEED_RETURN_IF_ERROR(CheckSource(out[i], whole[i].second, ftype, dims, what));
  return out;
}

}  // namespace gpufeed::h5
