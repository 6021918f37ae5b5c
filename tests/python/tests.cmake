# pytest for the Python module (tests/python/test_*.py), run with the interpreter the module
# was built for (a property of the ferry_python target, defined later in python/) and the
# build tree's package first on PYTHONPATH.
# Two tests, so ctest runs them side by side: the checkpoint engine's files (rollout processes
# per test: most of the time) and the rest. As one test they took 590-690 s alone, and ran
# past 900 s beside python.verl_stack and python.dcp in a fresh-clone CI run.
if(FERRY_BUILD_PYTHON AND EXISTS ${PROJECT_SOURCE_DIR}/python/CMakeLists.txt)
  set(FERRY_ENGINE_TESTS ${CMAKE_CURRENT_LIST_DIR}/test_checkpoint_engine.py
                         ${CMAKE_CURRENT_LIST_DIR}/test_checkpoint_engine_full_depth.py)
  set(FERRY_PYTEST $<TARGET_PROPERTY:ferry_python,FERRY_PYTHON_EXECUTABLE> -m pytest -q
                   -p no:cacheprovider)
  add_test(NAME python.pytest
           COMMAND ${FERRY_PYTEST} ${CMAKE_CURRENT_LIST_DIR}
                   --ignore=${CMAKE_CURRENT_LIST_DIR}/test_checkpoint_engine.py
                   --ignore=${CMAKE_CURRENT_LIST_DIR}/test_checkpoint_engine_full_depth.py
           WORKING_DIRECTORY ${PROJECT_BINARY_DIR})
  add_test(NAME python.checkpoint_engine
           COMMAND ${FERRY_PYTEST} ${FERRY_ENGINE_TESTS}
           WORKING_DIRECTORY ${PROJECT_BINARY_DIR})
  set_tests_properties(python.pytest python.checkpoint_engine PROPERTIES
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
  # 122 s alone, 523 s beside python.pytest and python.dcp in a fresh-clone CI run.
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
