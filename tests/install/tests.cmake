# `pip install .` into a fresh venv (check_pip_install.sh). Labelled install and slow: its
# first run compiles libferry once more, in ${PROJECT_BINARY_DIR}/pip-cmake, with this
# build's type, flags and compiler launcher (ccache reuses objects where it can).
if(FERRY_BUILD_PYTHON AND EXISTS ${PROJECT_SOURCE_DIR}/python/CMakeLists.txt)
  set(pip_cmake_args "-DCMAKE_BUILD_TYPE=${CMAKE_BUILD_TYPE}")
  foreach(var CMAKE_CXX_FLAGS_RELWITHDEBINFO CMAKE_C_FLAGS_RELWITHDEBINFO CMAKE_CXX_COMPILER_LAUNCHER
              CMAKE_C_COMPILER_LAUNCHER)
    if(${var})
      string(APPEND pip_cmake_args " '-D${var}=${${var}}'")
    endif()
  endforeach()
  add_test(NAME install.pip
           COMMAND bash ${CMAKE_CURRENT_LIST_DIR}/check_pip_install.sh ${PROJECT_SOURCE_DIR}
                   ${PROJECT_BINARY_DIR}/pip-cmake ${PROJECT_VERSION}
                   $<TARGET_PROPERTY:ferry_python,FERRY_PYTHON_EXECUTABLE>)
  set_tests_properties(install.pip PROPERTIES LABELS "install;slow" TIMEOUT 1800
                       ENVIRONMENT "FERRY_CMAKE_ARGS=${pip_cmake_args}")
endif()
