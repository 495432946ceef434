# Every dependency is a Debian package installed by scripts/setup.
find_package(PkgConfig REQUIRED)
find_package(Threads REQUIRED)
pkg_check_modules(HDF5 REQUIRED IMPORTED_TARGET hdf5-serial)   # Debian's thread-safe build
pkg_check_modules(ZSTD REQUIRED IMPORTED_TARGET libzstd)
pkg_check_modules(DEFLATE REQUIRED IMPORTED_TARGET libdeflate)
pkg_check_modules(TURBOJPEG REQUIRED IMPORTED_TARGET libturbojpeg)
# The libjpeg API of libjpeg-turbo: partial decoding (crop, skip) for encoded datasets.
pkg_check_modules(LIBJPEG REQUIRED IMPORTED_TARGET libjpeg)
pkg_check_modules(XXHASH REQUIRED IMPORTED_TARGET libxxhash)
# The plugin filters the direct path decodes (hdf5io/codec/codec_plugins.cc).
pkg_check_modules(LZF REQUIRED IMPORTED_TARGET liblzf)
pkg_check_modules(BLOSC REQUIRED IMPORTED_TARGET blosc)
pkg_check_modules(LZ4 REQUIRED IMPORTED_TARGET liblz4)
pkg_check_modules(URING REQUIRED IMPORTED_TARGET liburing)   # direct I/O's read-ahead (hdf5io/io/direct_io.cc)
pkg_check_modules(CURL REQUIRED IMPORTED_TARGET libcurl)     # s3:// and https:// objects (hdf5io/io/http_file.cc)
find_package(TBB REQUIRED)
find_package(PNG REQUIRED)
find_package(ZLIB REQUIRED)
find_package(CLI11 REQUIRED)
find_package(nlohmann_json REQUIRED)
find_package(Eigen3 3.3 REQUIRED NO_MODULE)   # CPU reference GEMMs of the trainer
# Boost.Asio, header-only (Debian's libboost-dev): the daemon's networking.
find_package(Boost 1.74 REQUIRED)
# spdlog (Debian's libspdlog-dev, on fmt): the daemon's structured log.
find_package(spdlog REQUIRED)
