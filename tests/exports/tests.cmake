# libferry.so exports only its public API, and the CLI holds no second copy of libferry's
# state (check_exports.py says how both are decided).
find_program(FERRY_NM nm)
find_package(Python3 COMPONENTS Interpreter QUIET)
if(FERRY_NM AND Python3_Interpreter_FOUND)
  add_test(NAME exports.public_api_only
           COMMAND ${Python3_EXECUTABLE} ${CMAKE_CURRENT_LIST_DIR}/check_exports.py
                   $<TARGET_FILE:ferry> ${PROJECT_SOURCE_DIR}/include/ferry $<TARGET_FILE:ferry_cli>)
  set_tests_properties(exports.public_api_only PROPERTIES LABELS exports TIMEOUT 120)
endif()
