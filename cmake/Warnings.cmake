# Warnings and sanitizers, per target (no global flags).
# Our own targets build warning-free with gcc and clang, and stay so: a
# warning in gpufeed's code fails the build (CI builds with both). Third-party
# headers come in through imported targets, as system includes, so their
# warnings are not ours. GPUFEED_WERROR=OFF for a compiler newer than CI's
# that finds something new, until it is fixed.
option(GPUFEED_WERROR "Warnings in gpufeed's own targets fail the build" ON)
function(gpufeed_warnings target)
  target_compile_options(${target} PRIVATE $<$<COMPILE_LANGUAGE:CXX>:-Wall -Wextra -Wno-unused-parameter>)
  if(GPUFEED_WERROR)
    target_compile_options(${target} PRIVATE $<$<COMPILE_LANGUAGE:CXX>:-Werror>)
  endif()
  # gcc 12 at -O3 reports its own libstdc++'s `"text" + std::string` as an
  # overlapping memcpy of 2^63 bytes (GCC bugs 105329, 105651): not a
  # fault of the code it names, and no rewrite of ours avoids it everywhere.
  if(CMAKE_CXX_COMPILER_ID STREQUAL "GNU" AND CMAKE_CXX_COMPILER_VERSION VERSION_LESS 13)
    target_compile_options(${target} PRIVATE $<$<COMPILE_LANGUAGE:CXX>:-Wno-restrict>)
  endif()
  # GUARDED_BY / REQUIRES (common/thread_annotations.h) are checked by clang:
  # a violation fails the build (scripts/test's sanitizer pass builds with clang).
  if(CMAKE_CXX_COMPILER_ID STREQUAL "Clang")
    target_compile_options(${target} PRIVATE $<$<COMPILE_LANGUAGE:CXX>:-Wthread-safety -Werror=thread-safety>)
  endif()
endfunction()

# Sanitized builds compile at -O1 (the level the sanitizers' documentation
# advises), after the build type's -O2; with clang, with line tables only for
# debug information (all a report's stack needs). Each build of CI's three
# sanitized trees took about a tenth less compile time so.
if(GPUFEED_SANITIZE STREQUAL "address")
  add_compile_options($<$<COMPILE_LANGUAGE:CXX>:-fsanitize=address,undefined> $<$<COMPILE_LANGUAGE:CXX>:-fno-omit-frame-pointer>
                      $<$<COMPILE_LANGUAGE:CXX>:-O1>)
  if(CMAKE_CXX_COMPILER_ID STREQUAL "Clang")
    add_compile_options($<$<COMPILE_LANGUAGE:CXX>:-gline-tables-only>)
  endif()
  add_link_options(-fsanitize=address,undefined)
elseif(GPUFEED_SANITIZE STREQUAL "thread")
  add_compile_options($<$<COMPILE_LANGUAGE:CXX>:-fsanitize=thread> $<$<COMPILE_LANGUAGE:CXX>:-O1>)
  if(CMAKE_CXX_COMPILER_ID STREQUAL "Clang")
    add_compile_options($<$<COMPILE_LANGUAGE:CXX>:-gline-tables-only>)
  endif()
  add_link_options(-fsanitize=thread)
  # gcc's ThreadSanitizer does not model std::atomic_thread_fence, and says so
  # (-Wtsan) wherever Asio's fenced blocks are inlined into the daemon: a note
  # on the tool's reach in a third-party header, not a fault of our code.
  if(CMAKE_CXX_COMPILER_ID STREQUAL "GNU")
    add_compile_options($<$<COMPILE_LANGUAGE:CXX>:-Wno-tsan>)
  endif()
endif()
