# GPUFEED_FUZZ=ON: libFuzzer targets (tests/fuzz/, run by scripts/fuzz) in a
# build of their own (build-fuzz: clang, CUDA off, tests off). Everything is
# compiled with ASan + UBSan (UB fatal, so libFuzzer records it as a crash)
# and the fuzzer's coverage instrumentation; only the targets link libFuzzer's
# main (-fsanitize=fuzzer), the library gets -fsanitize=fuzzer-no-link.
option(GPUFEED_FUZZ "Build the libFuzzer targets (clang only)" OFF)
if(GPUFEED_FUZZ)
  if(NOT CMAKE_CXX_COMPILER_ID STREQUAL "Clang")
    message(FATAL_ERROR "GPUFEED_FUZZ needs clang: -DCMAKE_C_COMPILER=clang -DCMAKE_CXX_COMPILER=clang++")
  endif()
  if(GPUFEED_SANITIZE)
    message(FATAL_ERROR "GPUFEED_FUZZ brings its own sanitizers; leave GPUFEED_SANITIZE empty")
  endif()
  add_compile_options(-fsanitize=fuzzer-no-link,address,undefined -fno-sanitize-recover=undefined
                      -fno-omit-frame-pointer -O1 -gline-tables-only)
  add_link_options(-fsanitize=address,undefined)
endif()

# gpufeed_fuzz_target(name): tests/fuzz/<name>_fuzz.cc as gpufeed_fuzz_<name>.
function(gpufeed_fuzz_target name)
  add_executable(gpufeed_fuzz_${name} ${PROJECT_SOURCE_DIR}/tests/fuzz/${name}_fuzz.cc)
  target_include_directories(gpufeed_fuzz_${name} PRIVATE ${PROJECT_SOURCE_DIR})
  target_link_libraries(gpufeed_fuzz_${name} PRIVATE gpufeed PkgConfig::XXHASH PkgConfig::HDF5)
  target_link_options(gpufeed_fuzz_${name} PRIVATE -fsanitize=fuzzer)
  gpufeed_warnings(gpufeed_fuzz_${name})
  add_dependencies(gpufeed_fuzz gpufeed_fuzz_${name})
endfunction()
