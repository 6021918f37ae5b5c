# pytest for the Python module (tests/python/test_*.py), run with the interpreter the module
# was built for (a property of the ferry_python target, defined later in python/) and the
# build tree's package first on PYTHONPATH.
# Peer processes fork from a server that imported torch and ferry's verl backend once
# (conftest.processes()): spawned, each imported verl, Ray and transformers again, and the
# suite took 590-690 s alone instead of about 3 minutes.
if(FERRY_BUILD_PYTHON AND EXISTS ${PROJECT_SOURCE_DIR}/python/CMakeLists.txt)
  add_test(NAME python.pytest
           COMMAND $<TARGET_PROPERTY:ferry_python,FERRY_PYTHON_EXECUTABLE> -m pytest -q
                   -p no:cacheprovider ${CMAKE_CURRENT_LIST_DIR}
           WORKING_DIRECTORY ${PROJECT_BINARY_DIR})
  set_tests_properties(python.pytest PROPERTIES
    LABELS python TIMEOUT 900
    ENVIRONMENT "PYTHONPATH=${PROJECT_BINARY_DIR}/python;PYTHONDONTWRITEBYTECODE=1;HF_HUB_OFFLINE=1")
endif()

# ferry's verl backend under verl's real classes and real Ray (tests/verl_stack/): its own test,
# as it starts a Ray session and so runs beside python.pytest, not inside it.
if(FERRY_BUILD_PYTHON AND EXISTS ${PROJECT_SOURCE_DIR}/tests/verl_stack)
  add_test(NAME python.verl_stack
           COMMAND $<TARGET_PROPERTY:ferry_python,FERRY_PYTHON_EXECUTABLE> -m pytest -q
                   -p no:cacheprovider ${PROJECT_SOURCE_DIR}/tests/verl_stack
           WORKING_DIRECTORY ${PROJECT_BINARY_DIR})
  # 122 s alone, 440 s beside python.pytest and python.dcp in a fresh-clone CI run (186b9fa).
  set_tests_properties(python.verl_stack PROPERTIES
    LABELS "python;verl" TIMEOUT 1500
    ENVIRONMENT "PYTHONPATH=${PROJECT_BINARY_DIR}/python;PYTHONDONTWRITEBYTECODE=1;HF_HUB_OFFLINE=1")
endif()

# ferry.dcp under the real torch.distributed.checkpoint and megatron-core (tests/dcp/): jobs of
# several processes as two nodes, each with its own folder.
if(FERRY_BUILD_PYTHON AND EXISTS ${PROJECT_SOURCE_DIR}/tests/dcp)
  add_test(NAME python.dcp
           COMMAND $<TARGET_PROPERTY:ferry_python,FERRY_PYTHON_EXECUTABLE> -m pytest -q
                   -p no:cacheprovider ${PROJECT_SOURCE_DIR}/tests/dcp
           WORKING_DIRECTORY ${PROJECT_BINARY_DIR})
  set_tests_properties(python.dcp PROPERTIES
    LABELS "python;dcp" TIMEOUT 900
    ENVIRONMENT "PYTHONPATH=${PROJECT_BINARY_DIR}/python;PYTHONDONTWRITEBYTECODE=1")
endif()
