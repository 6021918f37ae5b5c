# `pip install .` into a fresh venv (check_pip_install.sh), packing this build's libferry and
# extension (setup.py's FERRY_CMAKE_PREBUILT) rather than compiling them a second time.
if(FERRY_BUILD_PYTHON AND EXISTS ${PROJECT_SOURCE_DIR}/python/CMakeLists.txt)
  add_test(NAME install.pip
           COMMAND bash ${CMAKE_CURRENT_LIST_DIR}/check_pip_install.sh ${PROJECT_SOURCE_DIR}
                   ${PROJECT_VERSION} $<TARGET_PROPERTY:ferry_python,FERRY_PYTHON_EXECUTABLE>)
  set_tests_properties(install.pip PROPERTIES LABELS install TIMEOUT 600
                       ENVIRONMENT "FERRY_CMAKE_PREBUILT=${PROJECT_BINARY_DIR}")
endif()
