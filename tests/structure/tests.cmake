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
