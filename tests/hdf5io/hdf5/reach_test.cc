// What a file may reach (hdf5io/hdf5/reach.h): a dataset's external raw-data files,
// virtual-dataset sources and external links lie under the dataset file's
// directory or a directory the user allowed (OpenOptions::allow_paths,
// GPUFEED_ALLOW_PATHS); anything else, an absolute path, a relative one that
// climbs out or a symbolic link out, is refused by Dataset::Open, the
// loader's door (OpenLocalSource) and the daemon's, naming the path and the
// option. Allowed, the same files read exactly their bytes.
#include <gtest/gtest.h>
#include <hdf5.h>

#include <unistd.h>

#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "daemon/datasets.h"
#include "gpufeed/dataset.h"
#include "gpufeed/open_source.h"
#include "tests/testing/test_data.h"

namespace gpufeed {
namespace {

constexpr hsize_t kN = 12, kW = 4;  // /images uint8 [12, 4]
constexpr uint64_t kBytes = kN * kW;

std::string Real(const std::string& p) { return std::filesystem::canonical(p).string(); }

// The raw bytes an external file holds: sample k's row is k * 10 + column.
std::vector<uint8_t> RawBytes(uint8_t salt) {
  std::vector<uint8_t> b(kBytes);
  for (uint64_t i = 0; i < kBytes; ++i) b[i] = static_cast<uint8_t>((i / kW) * 10 + i % kW + salt);
  return b;
}

void WriteRaw(const std::string& path, uint8_t salt) {
  const auto b = RawBytes(salt);
  std::ofstream(path, std::ios::binary).write(reinterpret_cast<const char*>(b.data()), b.size());
}

// `file` with dataset `name` uint8 [12, 4] whose raw data is external file
// `external` (the name as stored: absolute or relative), from byte 0.
void AddExternal(hid_t file, const char* name, const std::string& external) {
  hsize_t dims[2] = {kN, kW};
  hid_t space = H5Screate_simple(2, dims, nullptr);
  hid_t dcpl = H5Pcreate(H5P_DATASET_CREATE);
  ASSERT_GE(H5Pset_external(dcpl, external.c_str(), 0, kBytes), 0);
  hid_t d = H5Dcreate2(file, name, H5T_NATIVE_UINT8, space, H5P_DEFAULT, dcpl, H5P_DEFAULT);
  ASSERT_GE(d, 0) << external;
  H5Dclose(d);
  H5Pclose(dcpl);
  H5Sclose(space);
}

void WriteExternal(const std::string& path, const std::string& external) {
  hid_t f = H5Fcreate(path.c_str(), H5F_ACC_TRUNC, H5P_DEFAULT, H5P_DEFAULT);
  ASSERT_GE(f, 0) << path;
  AddExternal(f, "images", external);
  H5Fclose(f);
}

// /data uint8 [12, 4] holding RawBytes(salt), chunked.
void WriteSource(const std::string& path, uint8_t salt) {
  hid_t f = H5Fcreate(path.c_str(), H5F_ACC_TRUNC, H5P_DEFAULT, H5P_DEFAULT);
  ASSERT_GE(f, 0) << path;
  hsize_t dims[2] = {kN, kW}, chunk[2] = {4, kW};
  hid_t space = H5Screate_simple(2, dims, nullptr);
  hid_t dcpl = H5Pcreate(H5P_DATASET_CREATE);
  H5Pset_chunk(dcpl, 2, chunk);
  hid_t d = H5Dcreate2(f, "data", H5T_NATIVE_UINT8, space, H5P_DEFAULT, dcpl, H5P_DEFAULT);
  const auto b = RawBytes(salt);
  ASSERT_GE(H5Dwrite(d, H5T_NATIVE_UINT8, H5S_ALL, H5S_ALL, H5P_DEFAULT, b.data()), 0);
  H5Dclose(d);
  H5Pclose(dcpl);
  H5Sclose(space);
  H5Fclose(f);
}

// /images: a virtual dataset of all of `source`:/data (the name as stored).
void WriteVds(const std::string& path, const std::string& source) {
  hid_t f = H5Fcreate(path.c_str(), H5F_ACC_TRUNC, H5P_DEFAULT, H5P_DEFAULT);
  ASSERT_GE(f, 0) << path;
  hsize_t dims[2] = {kN, kW};
  hid_t vspace = H5Screate_simple(2, dims, nullptr);
  hid_t sspace = H5Screate_simple(2, dims, nullptr);
  hid_t dcpl = H5Pcreate(H5P_DATASET_CREATE);
  ASSERT_GE(H5Pset_virtual(dcpl, vspace, source.c_str(), "/data", sspace), 0);
  hid_t d = H5Dcreate2(f, "images", H5T_NATIVE_UINT8, vspace, H5P_DEFAULT, dcpl, H5P_DEFAULT);
  ASSERT_GE(d, 0);
  H5Dclose(d);
  H5Pclose(dcpl);
  H5Sclose(sspace);
  H5Sclose(vspace);
  H5Fclose(f);
}

// A refusal: InvalidArgument naming the path reached and the option.
void ExpectRefused(const Status& st, const std::string& path) {
  ASSERT_FALSE(st.ok());
  EXPECT_EQ(st.code(), StatusCode::kInvalidArgument) << st.ToString();
  EXPECT_NE(st.message().find(path), std::string::npos) << st.ToString();
  EXPECT_NE(st.message().find("allow_paths"), std::string::npos) << st.ToString();
  EXPECT_NE(st.message().find("--allow-paths"), std::string::npos) << st.ToString();
}

// Opened (through the probe, as a user's open is), every sample reads as
// RawBytes(salt).
void ExpectReads(const std::string& spec, const OpenOptions& o, uint8_t salt) {
  auto ds = Dataset::Open(spec, o);
  ASSERT_TRUE(ds.ok()) << ds.status().ToString();
  ASSERT_EQ(ds->num_samples(), kN);
  std::vector<std::byte> got(kBytes);
  ASSERT_TRUE(ds->ReadSamples(0, kN, got).ok());
  EXPECT_EQ(0, std::memcmp(got.data(), RawBytes(salt).data(), kBytes)) << spec;
}

// Dataset::Open, the loader's door and the daemon's all refuse it.
void ExpectRefusedEverywhere(const std::string& spec, const std::string& path) {
  auto ds = Dataset::Open(spec);
  ExpectRefused(ds.status(), path);
  auto local = OpenLocalSource(spec, OpenOptions{}, DecodeOptions{});
  ExpectRefused(local.status(), path);
  daemon::DatasetRegistry served;
  ExpectRefused(served.Add(spec, OpenOptions{}), path);
}

// HDF5 opens a relative external file name from the working directory
// (its default, which gpufeed keeps): the tests that read one work there.
class InDir {
 public:
  explicit InDir(const std::string& dir) : was_(std::filesystem::current_path()) { std::filesystem::current_path(dir); }
  ~InDir() { std::filesystem::current_path(was_); }

 private:
  std::filesystem::path was_;
};

struct Dirs {
  std::string base, data, outside;
};
Dirs MakeDirs(const std::string& tag) {
  Dirs d;
  d.base = testing::MakeTempDir(tag);
  d.data = d.base + "/data";
  d.outside = d.base + "/outside";
  std::filesystem::create_directories(d.data + "/sub");
  std::filesystem::create_directories(d.outside);
  return d;
}

TEST(ReachTest, ExternalFileAtAnAbsolutePathOutsideIsRefused) {
  const Dirs d = MakeDirs("reach_abs");
  WriteRaw(d.outside + "/secret.bin", 1);
  const std::string file = d.data + "/ext.h5";
  WriteExternal(file, d.outside + "/secret.bin");
  ExpectRefusedEverywhere(file, Real(d.outside + "/secret.bin"));
  OpenOptions allowed;
  allowed.allow_paths = {d.outside};
  ExpectReads(file, allowed, 1);
}

TEST(ReachTest, ExternalFileClimbingOutOfTheDirectoryIsRefused) {
  const Dirs d = MakeDirs("reach_rel");
  WriteRaw(d.outside + "/secret.bin", 2);
  const std::string file = d.data + "/sub/ext.h5";
  WriteExternal(file, "../../outside/secret.bin");
  InDir here(d.data + "/sub");
  ExpectRefusedEverywhere(file, Real(d.outside + "/secret.bin"));
  // Allowed, HDF5 finds it where gpufeed judged it.
  OpenOptions allowed;
  allowed.allow_paths = {d.outside};
  ExpectReads(file, allowed, 2);
  ::setenv("GPUFEED_ALLOW_PATHS", ("/nonexistent:" + d.outside).c_str(), 1);
  ExpectReads(file, OpenOptions{}, 2);
  ::unsetenv("GPUFEED_ALLOW_PATHS");
}

TEST(ReachTest, ASymbolicLinkOutIsJudgedByItsTarget) {
  const Dirs d = MakeDirs("reach_link");
  WriteRaw(d.outside + "/secret.bin", 3);
  ASSERT_EQ(0, ::symlink((d.outside + "/secret.bin").c_str(), (d.data + "/inside.bin").c_str()));
  const std::string file = d.data + "/ext.h5";
  WriteExternal(file, "inside.bin");
  InDir here(d.data);
  ExpectRefusedEverywhere(file, Real(d.outside + "/secret.bin"));
  // A link to nothing is refused too (it reaches whatever is made there).
  ASSERT_EQ(0, ::symlink((d.outside + "/later.bin").c_str(), (d.data + "/dangling.bin").c_str()));
  const std::string dangling = d.data + "/dangling.h5";
  WriteExternal(dangling, "dangling.bin");
  ExpectRefused(Dataset::Open(dangling).status(), d.data + "/dangling.bin");
}

TEST(ReachTest, ExternalFilesInTheDatasetsDirectoryRead) {
  const Dirs d = MakeDirs("reach_own");
  WriteRaw(d.data + "/raw.bin", 4);
  WriteRaw(d.data + "/sub/raw.bin", 5);
  WriteExternal(d.data + "/ext.h5", "raw.bin");
  WriteExternal(d.data + "/abs.h5", d.data + "/sub/raw.bin");
  InDir here(d.data);
  ExpectReads(d.data + "/ext.h5", OpenOptions{}, 4);
  ExpectReads(d.data + "/abs.h5", OpenOptions{}, 5);
  // A link inside the directory to a file inside it is fine.
  ASSERT_EQ(0, ::symlink((d.data + "/sub/raw.bin").c_str(), (d.data + "/link.bin").c_str()));
  WriteExternal(d.data + "/link.h5", "link.bin");
  ExpectReads(d.data + "/link.h5", OpenOptions{}, 5);
  auto local = OpenLocalSource(d.data + "/ext.h5", OpenOptions{}, DecodeOptions{});
  ASSERT_TRUE(local.ok()) << local.status().ToString();
}

TEST(ReachTest, LabelsInAnExternalFileOutsideAreRefused) {
  const Dirs d = MakeDirs("reach_labels");
  WriteRaw(d.data + "/raw.bin", 6);
  WriteRaw(d.outside + "/secret.bin", 7);
  const std::string file = d.data + "/ext.h5";
  hid_t f = H5Fcreate(file.c_str(), H5F_ACC_TRUNC, H5P_DEFAULT, H5P_DEFAULT);
  AddExternal(f, "images", d.data + "/raw.bin");
  {
    hsize_t n = kN;
    hid_t space = H5Screate_simple(1, &n, nullptr);
    hid_t dcpl = H5Pcreate(H5P_DATASET_CREATE);
    H5Pset_external(dcpl, (d.outside + "/secret.bin").c_str(), 0, kN);
    H5Dclose(H5Dcreate2(f, "labels", H5T_NATIVE_UINT8, space, H5P_DEFAULT, dcpl, H5P_DEFAULT));
    H5Pclose(dcpl);
    H5Sclose(space);
  }
  H5Fclose(f);
  ExpectRefusedEverywhere(file, Real(d.outside + "/secret.bin"));
}

TEST(ReachTest, VirtualSourceOutsideIsRefused) {
  const Dirs d = MakeDirs("reach_vds");
  WriteSource(d.outside + "/src.h5", 8);
  WriteSource(d.data + "/own.h5", 9);
  const std::string absolute = d.data + "/vds_abs.h5", climbing = d.data + "/sub/vds_rel.h5";
  WriteVds(absolute, d.outside + "/src.h5");
  WriteVds(climbing, "../../outside/src.h5");
  ExpectRefusedEverywhere(absolute, Real(d.outside + "/src.h5"));
  ExpectRefusedEverywhere(climbing, Real(d.outside + "/src.h5"));
  OpenOptions allowed;
  allowed.allow_paths = {d.outside};
  ExpectReads(absolute, allowed, 8);
  auto local = OpenLocalSource(absolute, allowed, DecodeOptions{});
  ASSERT_TRUE(local.ok()) << local.status().ToString();
  // A source beside the virtual dataset reads as before.
  WriteVds(d.data + "/vds_own.h5", "own.h5");
  ExpectReads(d.data + "/vds_own.h5", OpenOptions{}, 9);
}

TEST(ReachTest, AnExternalLinkOutIsRefused) {
  const Dirs d = MakeDirs("reach_elink");
  WriteSource(d.outside + "/src.h5", 10);
  const std::string file = d.data + "/link.h5";
  hid_t f = H5Fcreate(file.c_str(), H5F_ACC_TRUNC, H5P_DEFAULT, H5P_DEFAULT);
  ASSERT_GE(H5Lcreate_external((d.outside + "/src.h5").c_str(), "/data", f, "images", H5P_DEFAULT, H5P_DEFAULT), 0);
  H5Fclose(f);
  ExpectRefused(Dataset::Open(file).status(), d.outside + "/src.h5");
  OpenOptions allowed;
  allowed.allow_paths = {d.outside};
  ExpectReads(file, allowed, 10);
}

}  // namespace
}  // namespace gpufeed
