# The module graph (scripts/module_graph.py): every include of another module's header is a
# declared DEPS entry, and there is no cycle. The second test proves the check can fail.
find_package(Python3 REQUIRED COMPONENTS Interpreter)
add_test(NAME structure.module_graph
         COMMAND ${Python3_EXECUTABLE} ${PROJECT_SOURCE_DIR}/scripts/module_graph.py --check
                 --root ${PROJECT_SOURCE_DIR})
add_test(NAME structure.module_graph_script
         COMMAND ${Python3_EXECUTABLE} ${CMAKE_CURRENT_LIST_DIR}/module_graph_test.py)
set_tests_properties(structure.module_graph structure.module_graph_script PROPERTIES
                     LABELS structure TIMEOUT 60 ENVIRONMENT PYTHONDONTWRITEBYTECODE=1)

# The lock contracts: clang's -Wthread-safety sees base/mutex.h's annotations (an unlocked
# read of guarded state must fail to compile). Needs clang; GCC has no such analysis.
find_program(FERRY_CLANGXX NAMES clang++ clang++-14)
if(FERRY_CLANGXX)
  set(_probe_flags -std=c++20 -fsyntax-only -Wthread-safety -Werror -I${PROJECT_SOURCE_DIR}/src
                   ${CMAKE_CURRENT_LIST_DIR}/thread_safety_probe.cc)
  add_test(NAME structure.thread_safety_locked COMMAND ${FERRY_CLANGXX} ${_probe_flags})
  add_test(NAME structure.thread_safety_unlocked_read_rejected
           COMMAND ${FERRY_CLANGXX} ${_probe_flags} -DFERRY_PROBE_UNLOCKED_READ)
  set_tests_properties(structure.thread_safety_unlocked_read_rejected PROPERTIES WILL_FAIL TRUE)
  set_tests_properties(structure.thread_safety_locked structure.thread_safety_unlocked_read_rejected
                       PROPERTIES LABELS structure TIMEOUT 120)
endif()

# The tree stays clang-formatted (.clang-format), so diffs carry only real changes.
find_program(FERRY_CLANG_FORMAT NAMES clang-format clang-format-14)
if(FERRY_CLANG_FORMAT)
  add_test(NAME structure.clang_format
           COMMAND ${PROJECT_SOURCE_DIR}/scripts/check_format.sh ${FERRY_CLANG_FORMAT})
  set_tests_properties(structure.clang_format PROPERTIES LABELS structure TIMEOUT 120)
endif()

# The source units one round crosses (docs/architecture.md, "One round, file by file"),
# measured: scripts/round_units.py runs tests/structure/one_round.cc under callgrind and
# compares the files whose code ran inside the round with the lists in the doc.
add_executable(one_round ${CMAKE_CURRENT_LIST_DIR}/one_round.cc)
target_link_libraries(one_round PRIVATE ferry)
find_program(FERRY_VALGRIND NAMES valgrind)
if(FERRY_VALGRIND AND FERRY_SANITIZE STREQUAL "")  # valgrind cannot run a sanitized binary
  add_test(NAME structure.round_units
           COMMAND ${Python3_EXECUTABLE} ${PROJECT_SOURCE_DIR}/scripts/round_units.py
                   --binary $<TARGET_FILE:one_round> --check ${PROJECT_SOURCE_DIR}/docs/architecture.md)
  set_tests_properties(structure.round_units PROPERTIES LABELS structure TIMEOUT 300
                       ENVIRONMENT PYTHONDONTWRITEBYTECODE=1)
endif()
