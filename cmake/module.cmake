# ferry_module(NAME SOURCES ... DEPS ...): one static library per src/<module>,
# linked whole into libferry. Keeping modules apart means a module's tests build
# only the layers it uses (DESIGN.md: each layer uses only the ones above it).
function(ferry_module name)
  cmake_parse_arguments(M "" "" "SOURCES;DEPS" ${ARGN})
  add_library(ferry_${name} STATIC ${M_SOURCES})
  target_include_directories(ferry_${name}
    PUBLIC $<BUILD_INTERFACE:${PROJECT_SOURCE_DIR}/include> $<BUILD_INTERFACE:${PROJECT_SOURCE_DIR}/src>)
  target_link_libraries(ferry_${name} PUBLIC ${M_DEPS} ferry_deps)
  # Hidden unless include/ferry/ marks it FERRY_EXPORT: libferry.so exports its public API only.
  set_target_properties(ferry_${name} PROPERTIES C_VISIBILITY_PRESET hidden CXX_VISIBILITY_PRESET hidden
                                                 VISIBILITY_INLINES_HIDDEN ON)
  ferry_set_warnings(ferry_${name})
  set_property(GLOBAL APPEND PROPERTY FERRY_MODULE_TARGETS ferry_${name})
endfunction()
