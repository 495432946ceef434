# gpufeed_test(dir/name_test): adds tests/dir/name_test.cc to the one test
# binary (one link instead of dozens on a 2-core machine); CTest sees each
# GoogleTest case separately.
#
# Tiers, as CTest labels (ctest -L <label>):
#   fast  CPU cases that each take well under a second: the inner loop,
#         `scripts/test --fast` (about half a minute for all of them)
#   slow  CPU cases that take seconds (daemon round trips, training runs,
#         stress and hold tests, whole-dataset conversions, h5py interop)
#   gpu   cases that exercise a GPU (they skip themselves where none exists)
#   fuzz  the fuzz targets' corpus replays (the ASan tree only: cmake/Fuzz.cmake)
# Each case has exactly one label (gtest_discover_tests splits a "a;b" list
# of labels into separate property arguments). The tiers are assigned by name
# at discovery: one gtest_discover_tests per tier, each with a --gtest_filter.
# A new slow or GPU case needs its name (or its suite's) in the lists below;
# everything else is `fast`, and scripts/test fails when a `fast` case takes
# over 2.5 s (tests/structure/check_tiers.py, on the run it just made), so a
# slow case left off the list is named, not silently fast.
find_package(GTest REQUIRED)
include(GoogleTest)
set(GPUFEED_TEST_SOURCES "" CACHE INTERNAL "")
# GoogleTest filters (':'-separated patterns) over suite.case names.
set(GPUFEED_GPU_TESTS "TransformGpuTest.*:MaskTransformGpuTest.*:ImageDecoderGpuTest.*:*/Gpu:*CudaVsCpu.*:*OnTheGpu:*.GpuTraining*")
set(GPUFEED_SLOW_TESTS "DaemonTest.*:TrainerTest.*:LoaderHoldTest.*:FashionMnistTest.*:HostileFilesTest.*:PluginFiltersTest.*:\
LoaderTest.ConsumerHoldingPrefetchBatchesGetsEverySampleOnce:LoaderTest.InterruptEndsTheCurrentOrNextWaitOnce:\
ChunkCacheTest.PrefetchesWhatTheNextBatchesNeed")
# gpufeed_test(dir/name_test SINGLE_THREADED): a file whose cases, and the
# library code they drive, run on the calling thread only (no std::thread,
# TBB, daemon, loader, feeder, trainer or fork). GPUFEED_TESTS_THREADED_ONLY=ON
# (scripts/test's ThreadSanitizer tree) leaves such files out of the test
# binary: ThreadSanitizer finds nothing where one thread runs, and every case
# still runs in the normal and ASan passes. A file not marked runs under TSan.
option(GPUFEED_TESTS_THREADED_ONLY "Build only the test files that run threads (not SINGLE_THREADED)" OFF)
macro(gpufeed_test name)
  set(_gpufeed_test_flags ${ARGN})
  set(_gpufeed_test_args ${ARGN})
  list(REMOVE_ITEM _gpufeed_test_args SINGLE_THREADED)
  if(_gpufeed_test_args)
    message(FATAL_ERROR "gpufeed_test(${name} ${ARGN}): unknown argument(s) ${_gpufeed_test_args}; the one option is SINGLE_THREADED")
  endif()
  if(NOT (GPUFEED_TESTS_THREADED_ONLY AND "SINGLE_THREADED" IN_LIST _gpufeed_test_flags))
    list(APPEND GPUFEED_TEST_SOURCES ${PROJECT_SOURCE_DIR}/tests/${name}.cc)
  endif()
endmacro()
macro(gpufeed_test_finish)
  add_executable(gpufeed_tests ${GPUFEED_TEST_SOURCES} ${PROJECT_SOURCE_DIR}/tests/testing/test_data.cc)
  target_include_directories(gpufeed_tests PRIVATE ${PROJECT_SOURCE_DIR})
  target_link_libraries(gpufeed_tests PRIVATE gpufeed GTest::gtest_main PkgConfig::HDF5
                        PkgConfig::TURBOJPEG PkgConfig::XXHASH PNG::PNG ZLIB::ZLIB)
  target_compile_definitions(gpufeed_tests PRIVATE GPUFEED_SOURCE_DIR="${PROJECT_SOURCE_DIR}"
                             GPUFEED_TESTS_HAVE_CLI=$<BOOL:${GPUFEED_BUILD_CLI}>
                             GPUFEED_TESTS_HAVE_CUDA=$<BOOL:${GPUFEED_WITH_CUDA}>)
  # Test code gets the library's warnings; designated initializers in tests
  # name only the fields a case sets (gcc 12 warns about the rest).
  gpufeed_warnings(gpufeed_tests)
  target_compile_options(gpufeed_tests PRIVATE -Wno-missing-field-initializers)
  # gcc 12 at -O3 (not at the default -O2) calls the vector inside a test's
  # designated-initializer temporaries ({.chunk = {7, 3, 5, 4}}) "maybe
  # uninitialized" when it destroys them (clang does not; the library, at -O3
  # too, has no such warning).
  if(CMAKE_CXX_COMPILER_ID STREQUAL "GNU" AND CMAKE_CXX_COMPILER_VERSION VERSION_LESS 13)
    target_compile_options(gpufeed_tests PRIVATE -Wno-maybe-uninitialized)
  endif()
  # A hang fails the test after 5 minutes instead of stalling CI.
  gtest_discover_tests(gpufeed_tests TEST_FILTER "${GPUFEED_GPU_TESTS}"
                       PROPERTIES LABELS gpu TIMEOUT 300 DISCOVERY_TIMEOUT 60)
  gtest_discover_tests(gpufeed_tests TEST_FILTER "${GPUFEED_SLOW_TESTS}-${GPUFEED_GPU_TESTS}"
                       PROPERTIES LABELS slow TIMEOUT 300 DISCOVERY_TIMEOUT 60)
  gtest_discover_tests(gpufeed_tests TEST_FILTER "-${GPUFEED_SLOW_TESTS}:${GPUFEED_GPU_TESTS}"
                       PROPERTIES LABELS fast TIMEOUT 300 DISCOVERY_TIMEOUT 60)
endmacro()
