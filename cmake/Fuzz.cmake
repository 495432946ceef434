# GPUFEED_FUZZ=ON: libFuzzer targets (tests/fuzz/, run by scripts/fuzz) in the
# AddressSanitizer + UndefinedBehaviorSanitizer tree (scripts/asan-tree:
# clang, GPUFEED_SANITIZE=address), so CI compiles the library once for both
# the sanitized test suite and the fuzzers. Everything gets the fuzzer's
# coverage instrumentation (-fsanitize=fuzzer-no-link; outside a fuzz target
# the sanitizer runtime's no-op callbacks take it) and UB made fatal at
# compile time, so libFuzzer records it as a crash (the test suite's
# UBSAN_OPTIONS=halt_on_error=1 did the same at run time); only the targets
# link libFuzzer's main (-fsanitize=fuzzer).
option(GPUFEED_FUZZ "Build the libFuzzer targets (clang, GPUFEED_SANITIZE=address)" OFF)
if(GPUFEED_FUZZ)
  if(NOT CMAKE_CXX_COMPILER_ID STREQUAL "Clang")
    message(FATAL_ERROR "GPUFEED_FUZZ needs clang: -DCMAKE_C_COMPILER=clang -DCMAKE_CXX_COMPILER=clang++ (scripts/asan-tree)")
  endif()
  if(NOT GPUFEED_SANITIZE STREQUAL "address")
    message(FATAL_ERROR "GPUFEED_FUZZ builds in the ASan + UBSan tree: add -DGPUFEED_SANITIZE=address (scripts/asan-tree)")
  endif()
  add_compile_options($<$<COMPILE_LANGUAGE:CXX>:-fsanitize=fuzzer-no-link>
                      $<$<COMPILE_LANGUAGE:CXX>:-fno-sanitize-recover=undefined>)
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
