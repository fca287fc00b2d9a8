# Every tests/test_*.c is one executable; every KVO_TEST(name) in it is one
# ctest entry "<file>.<name>" (exit 77 = skipped).
get_filename_component(KVO_SHARED_DIR "${PROJECT_SOURCE_DIR}/../shared" ABSOLUTE)
add_library(kvo_testlib STATIC ${PROJECT_SOURCE_DIR}/tests/kvo_test.c)
target_include_directories(kvo_testlib PUBLIC ${PROJECT_SOURCE_DIR}/tests)
target_link_libraries(kvo_testlib PUBLIC kvoffload)
target_compile_definitions(kvo_testlib PUBLIC
  KVO_SHARED_DIR="${KVO_SHARED_DIR}" KVO_SOURCE_DIR="${PROJECT_SOURCE_DIR}"
  KVO_CLI_PATH="$<TARGET_FILE:kvoffload_cli>")

file(GLOB KVO_TEST_SOURCES CONFIGURE_DEPENDS ${PROJECT_SOURCE_DIR}/tests/test_*.c)
foreach(src ${KVO_TEST_SOURCES})
  get_filename_component(exe ${src} NAME_WE)
  add_executable(${exe} ${src})
  target_include_directories(${exe} PRIVATE ${PROJECT_SOURCE_DIR}/src)
  target_link_libraries(${exe} PRIVATE kvo_testlib)
  if(TARGET kvo_engine)
    target_link_libraries(${exe} PRIVATE kvo_engine)
  endif()
  add_dependencies(${exe} kvoffload_cli)
  string(REGEX REPLACE "^test_" "" suite ${exe})
  # Test names are read from the source: re-configure when it changes.
  set_property(DIRECTORY APPEND PROPERTY CMAKE_CONFIGURE_DEPENDS ${src})
  file(STRINGS ${src} decls REGEX "^KVO_TEST\\([A-Za-z0-9_]+\\)")
  foreach(decl ${decls})
    string(REGEX REPLACE "^KVO_TEST\\(([A-Za-z0-9_]+)\\).*" "\\1" name "${decl}")
    add_test(NAME ${suite}.${name} COMMAND ${exe} ${name})
    # Extra labels for a suite: set(KVO_TEST_LABELS_<suite> ...) before this file.
    set_tests_properties(${suite}.${name} PROPERTIES SKIP_RETURN_CODE 77 TIMEOUT 300
      LABELS "${suite};${KVO_TEST_LABELS_${suite}}")
  endforeach()
endforeach()
