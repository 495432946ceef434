# `cmake --install build --prefix P` installs what an outside project uses:
#   P/include/gpufeed/*.h            the public contracts (C++ and the C API)
#   P/lib/libgpufeed_*.a             the C++ library, a static library per module -> find_package(gpufeed),
#                                    gpufeed::gpufeed (all of them) or gpufeed::loader, ::hdf5, ...
#   P/lib/libgpufeed.so              the C API            -> gpufeed::c_api, pkg-config gpufeed
#   P/lib/cmake/gpufeed/             the exported package (gpufeedConfig.cmake and its targets)
#   P/lib/pkgconfig/gpufeed.pc       the C API for pkg-config users
#   P/lib/gpufeed/hdf5-plugins/      the zstd filter for HDF5 tools (HDF5_PLUGIN_PATH); with P /usr or
#                                    /usr/local also HDF5's default plugin directory (GPUFEED_HDF5_PLUGIN_DIR)
#   P/lib/python3/dist-packages/gpufeed   the Python package (finds ../../../libgpufeed.so)
#   P/bin/gpufeed                    the command line
# tests/install/install_test.sh builds an outside project against that tree.
include(GNUInstallDirs)
include(CMakePackageConfigHelpers)

set_target_properties(gpufeed_shared PROPERTIES EXPORT_NAME c_api)
foreach(m IN LISTS GPUFEED_MODULES)
  target_include_directories(${m} INTERFACE $<INSTALL_INTERFACE:${CMAKE_INSTALL_INCLUDEDIR}>)
endforeach()
target_include_directories(gpufeed_shared INTERFACE $<INSTALL_INTERFACE:${CMAKE_INSTALL_INCLUDEDIR}>)

install(TARGETS gpufeed ${GPUFEED_MODULES} gpufeed_shared EXPORT gpufeedTargets
        ARCHIVE DESTINATION ${CMAKE_INSTALL_LIBDIR}
        LIBRARY DESTINATION ${CMAKE_INSTALL_LIBDIR})
if(GPUFEED_BUILD_CLI)
  install(TARGETS gpufeed_cli RUNTIME DESTINATION ${CMAKE_INSTALL_BINDIR})
endif()
install(TARGETS gpufeed_h5zstd LIBRARY DESTINATION ${CMAKE_INSTALL_LIBDIR}/gpufeed/hdf5-plugins)
# Where HDF5 looks without HDF5_PLUGIN_PATH (its H5_DEFAULT_PLUGINDIR; Debian:
# /usr/lib/x86_64-linux-gnu/hdf5/serial/plugins): an install into the
# system (prefix /usr or /usr/local) puts the zstd plugin there too, so h5py
# and h5dump open the files gpufeed writes with nothing set by hand.
# -DGPUFEED_HDF5_PLUGIN_DIR= (empty) turns it off.
set(_gpufeed_h5_default "")
foreach(dir IN LISTS HDF5_INCLUDE_DIRS)
  if(EXISTS "${dir}/H5pubconf.h")
    file(STRINGS "${dir}/H5pubconf.h" _line REGEX "#define H5_DEFAULT_PLUGINDIR \"")
    string(REGEX REPLACE ".*\"([^\"]+)\".*" "\\1" _gpufeed_h5_default "${_line}")
    break()
  endif()
endforeach()
set(GPUFEED_HDF5_PLUGIN_DIR "${_gpufeed_h5_default}" CACHE PATH
    "HDF5's default plugin directory, where a system install also puts the zstd plugin (empty: nowhere)")
if(GPUFEED_HDF5_PLUGIN_DIR)
  install(CODE "
    if(CMAKE_INSTALL_PREFIX MATCHES \"^/usr(/local)?/?$\")
      file(INSTALL \"$<TARGET_FILE:gpufeed_h5zstd>\" DESTINATION \"${GPUFEED_HDF5_PLUGIN_DIR}\")
    else()
      message(STATUS \"gpufeed: not a system prefix; HDF5 finds the zstd plugin with HDF5_PLUGIN_PATH=\${CMAKE_INSTALL_PREFIX}/${CMAKE_INSTALL_LIBDIR}/gpufeed/hdf5-plugins\")
    endif()")
endif()
install(DIRECTORY ${PROJECT_SOURCE_DIR}/include/gpufeed ${PROJECT_BINARY_DIR}/include/gpufeed
        DESTINATION ${CMAKE_INSTALL_INCLUDEDIR} FILES_MATCHING PATTERN "*.h")
install(DIRECTORY ${PROJECT_SOURCE_DIR}/python/gpufeed DESTINATION ${CMAKE_INSTALL_LIBDIR}/python3/dist-packages
        PATTERN __pycache__ EXCLUDE)

set(GPUFEED_CONFIG_DIR ${CMAKE_INSTALL_LIBDIR}/cmake/gpufeed)
install(EXPORT gpufeedTargets NAMESPACE gpufeed:: DESTINATION ${GPUFEED_CONFIG_DIR})
configure_package_config_file(${PROJECT_SOURCE_DIR}/cmake/gpufeedConfig.cmake.in
                              ${PROJECT_BINARY_DIR}/gpufeedConfig.cmake INSTALL_DESTINATION ${GPUFEED_CONFIG_DIR})
write_basic_package_version_file(${PROJECT_BINARY_DIR}/gpufeedConfigVersion.cmake
                                 COMPATIBILITY SameMinorVersion)
install(FILES ${PROJECT_BINARY_DIR}/gpufeedConfig.cmake ${PROJECT_BINARY_DIR}/gpufeedConfigVersion.cmake
        DESTINATION ${GPUFEED_CONFIG_DIR})

configure_file(${PROJECT_SOURCE_DIR}/cmake/gpufeed.pc.in ${PROJECT_BINARY_DIR}/gpufeed.pc @ONLY)
install(FILES ${PROJECT_BINARY_DIR}/gpufeed.pc DESTINATION ${CMAKE_INSTALL_LIBDIR}/pkgconfig)
