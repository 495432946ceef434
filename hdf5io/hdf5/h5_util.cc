// HDF5 handle ownership, error-stack capture and attribute helpers.
#include "hdf5io/hdf5/h5_util.h"

#include <mutex>

#include "hdf5io/hdf5/zstd_filter.h"

namespace gpufeed::h5 {

void Id::Reset() {
  if (id_ < 0) return;
  switch (H5Iget_type(id_)) {
    case H5I_FILE:
      H5Fclose(id_);
      break;
    case H5I_GROUP:
      H5Gclose(id_);
      break;
    case H5I_DATASET:
      H5Dclose(id_);
      break;
    case H5I_DATASPACE:
      H5Sclose(id_);
      break;
    case H5I_DATATYPE:
      H5Tclose(id_);
      break;
    case H5I_ATTR:
      H5Aclose(id_);
      break;
    case H5I_GENPROP_LST:
      H5Pclose(id_);
      break;
    default:
      H5Idec_ref(id_);
      break;
  }
  id_ = H5I_INVALID_HID;
}

void QuietErrors() {
  thread_local bool quiet = false;
  if (!quiet) {
    H5Eset_auto2(H5E_DEFAULT, nullptr, nullptr);
    quiet = true;
  }
}

namespace {

herr_t CollectError(unsigned n, const H5E_error2_t* err, void* client) {
  auto* out = static_cast<std::vector<std::string>*>(client);
  (void)n;
  if (err->desc != nullptr && err->desc[0] != '\0') out->emplace_back(err->desc);
  return 0;
}

}  // namespace

std::string LastErrorText() {
  std::vector<std::string> descs;
  H5Ewalk2(H5E_DEFAULT, H5E_WALK_DOWNWARD, CollectError, &descs);
  H5Eclear2(H5E_DEFAULT);
  // Outermost first, innermost last: the innermost says what actually broke
  // ("truncated file"), the outermost what was attempted. Keep both ends.
  std::string text;
  if (descs.empty()) return text;
  text = descs.front();
  if (descs.size() > 1) text += " (" + descs.back() + ")";
  return text;
}

void EnsureZstdFilterRegistered() {
  static std::once_flag once;
  std::call_once(once, [] {
    QuietErrors();
    // A file's metadata cache is a 0.5 MB structure. HDF5 keeps at most 64
    // KB a free list (1 MB in all) for reuse, so each open of a small file
    // took fresh pages from the kernel for it (about 150 page faults a file;
    // opening 10,000 one-sample files went 25% faster with these limits).
    // Regular lists up to 4 MB each, 16 MB in all; the others as HDF5's
    // defaults.
    H5set_free_list_limits(16 << 20, 4 << 20, 4 << 20, 256 << 10, 16 << 20, 1 << 20);
    if (H5Zfilter_avail(kZstdFilterId) <= 0) H5Zregister(&kZstdFilterClass);
  });
}

namespace {

herr_t VisitObject(hid_t, const char* name, const H5O_info_t* info, void* client) {
  auto* out = static_cast<std::vector<std::string>*>(client);
  if (info->type == H5O_TYPE_DATASET) out->push_back(std::string("/") + name);
  return 0;
}

}  // namespace

std::vector<std::string> ListDatasets(hid_t file) {
  std::vector<std::string> out;
  H5Ovisit(file, H5_INDEX_NAME, H5_ITER_INC, VisitObject, &out);
  H5Eclear2(H5E_DEFAULT);
  return out;
}

std::string ReadStringAttr(hid_t obj, const char* name) {
  if (H5Aexists(obj, name) <= 0) return "";
  Id attr(H5Aopen(obj, name, H5P_DEFAULT));
  Id type(H5Aget_type(attr.get()));
  if (H5Tget_class(type.get()) != H5T_STRING) return "";
  Id space(H5Aget_space(attr.get()));
  if (H5Sget_simple_extent_npoints(space.get()) != 1) return "";
  if (H5Tis_variable_str(type.get()) > 0) {
    char* value = nullptr;
    Id mem(H5Tcopy(H5T_C_S1));
    H5Tset_size(mem.get(), H5T_VARIABLE);
    H5Tset_cset(mem.get(), H5Tget_cset(type.get()));
    if (H5Aread(attr.get(), mem.get(), &value) < 0 || value == nullptr) return "";
    std::string s(value);
    H5free_memory(value);
    return s;
  }
  size_t n = H5Tget_size(type.get());
  std::string s(n, '\0');
  if (H5Aread(attr.get(), type.get(), s.data()) < 0) return "";
  s.resize(s.find_last_not_of(std::string(" \0", 2)) + 1);
  return s;
}

std::vector<std::string> ReadStringArrayAttr(hid_t obj, const char* name) {
  std::vector<std::string> out;
  if (H5Aexists(obj, name) <= 0) return out;
  Id attr(H5Aopen(obj, name, H5P_DEFAULT));
  Id type(H5Aget_type(attr.get()));
  if (H5Tget_class(type.get()) != H5T_STRING) return out;
  Id space(H5Aget_space(attr.get()));
  hssize_t n = H5Sget_simple_extent_npoints(space.get());
  if (n <= 0) return out;
  if (H5Tis_variable_str(type.get()) > 0) {
    std::vector<char*> ptrs(static_cast<size_t>(n), nullptr);
    Id mem(H5Tcopy(H5T_C_S1));
    H5Tset_size(mem.get(), H5T_VARIABLE);
    H5Tset_cset(mem.get(), H5Tget_cset(type.get()));
    if (H5Aread(attr.get(), mem.get(), ptrs.data()) < 0) return out;
    for (char* p : ptrs) {
      out.emplace_back(p ? p : "");
      if (p) H5free_memory(p);
    }
    return out;
  }
  size_t width = H5Tget_size(type.get());
  std::vector<char> buf(width * static_cast<size_t>(n));
  if (H5Aread(attr.get(), type.get(), buf.data()) < 0) return out;
  for (hssize_t i = 0; i < n; ++i) {
    std::string s(buf.data() + i * width, width);
    s.resize(s.find_last_not_of(std::string(" \0", 2)) + 1);
    out.push_back(std::move(s));
  }
  return out;
}

std::vector<double> ReadDoubleArrayAttr(hid_t obj, const char* name) {
  std::vector<double> out;
  if (H5Aexists(obj, name) <= 0) return out;
  Id attr(H5Aopen(obj, name, H5P_DEFAULT));
  Id type(H5Aget_type(attr.get()));
  H5T_class_t cls = H5Tget_class(type.get());
  if (cls != H5T_FLOAT && cls != H5T_INTEGER) return out;
  Id space(H5Aget_space(attr.get()));
  hssize_t n = H5Sget_simple_extent_npoints(space.get());
  if (n <= 0) return out;
  out.resize(static_cast<size_t>(n));
  if (H5Aread(attr.get(), H5T_NATIVE_DOUBLE, out.data()) < 0) out.clear();
  return out;
}

namespace {

Status AttrError(const char* name) {
  return Status::Internal(std::string("writing attribute '") + name + "': " + LastErrorText());
}

}  // namespace

Status WriteStringAttr(hid_t obj, const char* name, const std::string& value) {
  Id type(H5Tcopy(H5T_C_S1));
  H5Tset_size(type.get(), value.empty() ? 1 : value.size());
  H5Tset_strpad(type.get(), H5T_STR_NULLPAD);
  Id space(H5Screate(H5S_SCALAR));
  if (H5Aexists(obj, name) > 0) H5Adelete(obj, name);
  Id attr(H5Acreate2(obj, name, type.get(), space.get(), H5P_DEFAULT, H5P_DEFAULT));
  if (!attr.valid()) return AttrError(name);
  std::string padded = value.empty() ? std::string(1, '\0') : value;
  if (H5Awrite(attr.get(), type.get(), padded.data()) < 0) return AttrError(name);
  return Status::Ok();
}

Status WriteStringArrayAttr(hid_t obj, const char* name, const std::vector<std::string>& values) {
  if (values.empty()) return Status::Ok();
  Id type(H5Tcopy(H5T_C_S1));
  H5Tset_size(type.get(), H5T_VARIABLE);
  H5Tset_cset(type.get(), H5T_CSET_UTF8);
  hsize_t n = values.size();
  Id space(H5Screate_simple(1, &n, nullptr));
  if (H5Aexists(obj, name) > 0) H5Adelete(obj, name);
  Id attr(H5Acreate2(obj, name, type.get(), space.get(), H5P_DEFAULT, H5P_DEFAULT));
  if (!attr.valid()) return AttrError(name);
  std::vector<const char*> ptrs;
  for (const std::string& v : values) ptrs.push_back(v.c_str());
  if (H5Awrite(attr.get(), type.get(), ptrs.data()) < 0) return AttrError(name);
  return Status::Ok();
}

Status WriteDoubleArrayAttr(hid_t obj, const char* name, const std::vector<double>& values) {
  if (values.empty()) return Status::Ok();
  hsize_t n = values.size();
  Id space(H5Screate_simple(1, &n, nullptr));
  if (H5Aexists(obj, name) > 0) H5Adelete(obj, name);
  Id attr(H5Acreate2(obj, name, H5T_IEEE_F64LE, space.get(), H5P_DEFAULT, H5P_DEFAULT));
  if (!attr.valid()) return AttrError(name);
  if (H5Awrite(attr.get(), H5T_NATIVE_DOUBLE, values.data()) < 0) return AttrError(name);
  return Status::Ok();
}

}  // namespace gpufeed::h5
