# gpufeed_test(dir/name_test): adds tests/dir/name_test.cc to the one test
# binary (one link instead of dozens on a 2-core machine); CTest sees each
# GoogleTest case separately, labelled `cpu` (GPU cases skip themselves).
find_package(GTest REQUIRED)
include(GoogleTest)
set(GPUFEED_TEST_SOURCES "" CACHE INTERNAL "")
macro(gpufeed_test name)
  list(APPEND GPUFEED_TEST_SOURCES ${PROJECT_SOURCE_DIR}/tests/${name}.cc)
endmacro()
macro(gpufeed_test_finish)
  add_executable(gpufeed_tests ${GPUFEED_TEST_SOURCES} ${PROJECT_SOURCE_DIR}/tests/testing/test_data.cc)
  target_include_directories(gpufeed_tests PRIVATE ${PROJECT_SOURCE_DIR})
  target_link_libraries(gpufeed_tests PRIVATE gpufeed GTest::gtest_main PkgConfig::HDF5
                        PkgConfig::TURBOJPEG PkgConfig::XXHASH PNG::PNG ZLIB::ZLIB)
  target_compile_definitions(gpufeed_tests PRIVATE GPUFEED_SOURCE_DIR="${PROJECT_SOURCE_DIR}")
  # A hang fails the test after 5 minutes instead of stalling CI.
  gtest_discover_tests(gpufeed_tests PROPERTIES LABELS cpu TIMEOUT 300 DISCOVERY_TIMEOUT 60)
endmacro()
