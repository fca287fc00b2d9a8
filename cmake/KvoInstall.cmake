# Install rules: headers (with the generated kvo_version.h), libkvoffload.a
# and libkvoffload.so, the kvoffload CLI, its man page, kvoffload.pc and the
# CMake package (find_package(kvoffload) -> kvoffload::kvoffload).
# tools/test-consumers.sh installs into a temporary prefix and builds three
# consumers from it.
include(CMakePackageConfigHelpers)
set(KVO_CMAKE_DIR ${CMAKE_INSTALL_LIBDIR}/cmake/kvoffload)

install(DIRECTORY ${PROJECT_SOURCE_DIR}/include/kvoffload ${KVO_GEN_INCLUDE}/kvoffload
        DESTINATION ${CMAKE_INSTALL_INCLUDEDIR} FILES_MATCHING PATTERN "*.h")

set_target_properties(kvoffload PROPERTIES EXPORT_NAME kvoffload_static)
if(TARGET kvoffload_shared)
  set_target_properties(kvoffload_shared PROPERTIES EXPORT_NAME kvoffload)
endif()
install(TARGETS ${KVO_LIB_TARGETS} EXPORT kvoffloadTargets
        ARCHIVE DESTINATION ${CMAKE_INSTALL_LIBDIR}
        LIBRARY DESTINATION ${CMAKE_INSTALL_LIBDIR}
        RUNTIME DESTINATION ${CMAKE_INSTALL_BINDIR}
        INCLUDES DESTINATION ${CMAKE_INSTALL_INCLUDEDIR})
install(EXPORT kvoffloadTargets NAMESPACE kvoffload:: DESTINATION ${KVO_CMAKE_DIR})

if(TARGET kvoffload_cli)
  install(TARGETS kvoffload_cli RUNTIME DESTINATION ${CMAKE_INSTALL_BINDIR})
endif()
# The man page's title line carries project()'s version, not the one typed
# in docs/kvoffload.1 (the version is written in one place).
file(READ ${PROJECT_SOURCE_DIR}/docs/kvoffload.1 KVO_MAN)
string(REGEX REPLACE "(\n\\.TH KVOFFLOAD 1 \"[^\"]*\" \")kvoffload[^\"]*\"" "\\1kvoffload ${PROJECT_VERSION}\"" KVO_MAN "${KVO_MAN}")
file(WRITE ${PROJECT_BINARY_DIR}/kvoffload.1 "${KVO_MAN}")
install(FILES ${PROJECT_BINARY_DIR}/kvoffload.1 DESTINATION ${CMAKE_INSTALL_MANDIR}/man1)
install(FILES ${PROJECT_SOURCE_DIR}/LICENSE ${PROJECT_SOURCE_DIR}/README.md ${PROJECT_SOURCE_DIR}/CHANGELOG.md
        DESTINATION ${CMAKE_INSTALL_DOCDIR})

# pkg-config: relocatable -- the prefix is found from the .pc file's own
# place, so `cmake --install build --prefix P` gives a working P/.../kvoffload.pc.
file(RELATIVE_PATH KVO_PC_UP "/${CMAKE_INSTALL_LIBDIR}/pkgconfig" "/")
string(REGEX REPLACE "/$" "" KVO_PC_UP "${KVO_PC_UP}")
if(IS_ABSOLUTE "${CMAKE_INSTALL_LIBDIR}")
  set(KVO_PC_LIBDIR "${CMAKE_INSTALL_LIBDIR}")
else()
  set(KVO_PC_LIBDIR "\${prefix}/${CMAKE_INSTALL_LIBDIR}")
endif()
if(IS_ABSOLUTE "${CMAKE_INSTALL_INCLUDEDIR}")
  set(KVO_PC_INCLUDEDIR "${CMAKE_INSTALL_INCLUDEDIR}")
else()
  set(KVO_PC_INCLUDEDIR "\${prefix}/${CMAKE_INSTALL_INCLUDEDIR}")
endif()
configure_file(${PROJECT_SOURCE_DIR}/cmake/kvoffload.pc.in ${PROJECT_BINARY_DIR}/kvoffload.pc @ONLY)
install(FILES ${PROJECT_BINARY_DIR}/kvoffload.pc DESTINATION ${CMAKE_INSTALL_LIBDIR}/pkgconfig)

configure_package_config_file(${PROJECT_SOURCE_DIR}/cmake/kvoffloadConfig.cmake.in
  ${PROJECT_BINARY_DIR}/kvoffloadConfig.cmake INSTALL_DESTINATION ${KVO_CMAKE_DIR})
# 0.x: minor versions may break the API, so only the same major.minor matches.
write_basic_package_version_file(${PROJECT_BINARY_DIR}/kvoffloadConfigVersion.cmake
  VERSION ${PROJECT_VERSION} COMPATIBILITY SameMinorVersion)
install(FILES ${PROJECT_BINARY_DIR}/kvoffloadConfig.cmake ${PROJECT_BINARY_DIR}/kvoffloadConfigVersion.cmake
        DESTINATION ${KVO_CMAKE_DIR})

# The demo's bundled Mooncake sample: an installed `kvoffload demo` finds it
# at <prefix>/share/kvoffload/data/ (next to the executable's ../share).
install(FILES ${PROJECT_SOURCE_DIR}/data/mooncake_sample.jsonl ${PROJECT_SOURCE_DIR}/data/mooncake_sample.md
        DESTINATION ${CMAKE_INSTALL_DATADIR}/kvoffload/data)

# --- the CUDA device (when built): libkvoffload_cuda.so, kvoffload-cuda.pc,
# find_package(kvoffload COMPONENTS cuda) -> kvoffload::cuda.  Its own export
# set, so that the core's package works where the CUDA part is absent.
if(TARGET kvoffload_cuda_shared)
  set_target_properties(kvoffload_cuda_shared PROPERTIES EXPORT_NAME cuda)
  install(TARGETS kvoffload_cuda_shared EXPORT kvoffloadCudaTargets
          LIBRARY DESTINATION ${CMAKE_INSTALL_LIBDIR}
          RUNTIME DESTINATION ${CMAKE_INSTALL_BINDIR})
  install(EXPORT kvoffloadCudaTargets NAMESPACE kvoffload:: DESTINATION ${KVO_CMAKE_DIR})
  configure_file(${PROJECT_SOURCE_DIR}/cmake/kvoffload-cuda.pc.in ${PROJECT_BINARY_DIR}/kvoffload-cuda.pc @ONLY)
  install(FILES ${PROJECT_BINARY_DIR}/kvoffload-cuda.pc DESTINATION ${CMAKE_INSTALL_LIBDIR}/pkgconfig)
endif()
