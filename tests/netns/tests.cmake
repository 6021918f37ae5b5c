# Multi-node weight sync in network namespaces (needs root; skipped otherwise).
add_test(NAME netns.sync COMMAND bash ${CMAKE_CURRENT_LIST_DIR}/sync_netns_test.sh
                                 $<TARGET_FILE:ferry_cli>)
set_tests_properties(netns.sync PROPERTIES LABELS netns TIMEOUT 600 SKIP_RETURN_CODE 77
                                           RUN_SERIAL TRUE)
# Relays feeding relays (a chain of 3 and a tree of fan-out 2) across four namespaces.
add_test(NAME netns.relay_chain COMMAND bash ${CMAKE_CURRENT_LIST_DIR}/relay_chain_netns_test.sh
                                        $<TARGET_FILE:ferry_cli>)
set_tests_properties(netns.relay_chain PROPERTIES LABELS netns TIMEOUT 600 SKIP_RETURN_CODE 77
                                                  RUN_SERIAL TRUE)
# `ferry plan` against a measured run: 1 and 2 senders (serve --part) on nodes of their own,
# 4 nodes x 2 receivers, links shaped with tc to 1 Gb/s; each sender's link carries 1/S of the
# senders' bytes and the plan's bytes; then rank-local, 1 sender and each node's 2 ranks
# receiving --tp 0/2 and 1/2, each copying half the model out of its ring (about 1.5 minutes;
# docs/plan.md, "Validation").
add_test(NAME netns.plan_validate COMMAND bash ${CMAKE_CURRENT_LIST_DIR}/plan_netns_validate.sh
                                          $<TARGET_FILE:ferry_cli>)
set_tests_properties(netns.plan_validate PROPERTIES LABELS netns TIMEOUT 300 SKIP_RETURN_CODE 77
                                                    RUN_SERIAL TRUE)
# The verl checkpoint-engine backend, actor and rollout nodes in network namespaces.
if(FERRY_BUILD_PYTHON AND EXISTS ${PROJECT_SOURCE_DIR}/python/CMakeLists.txt)
  add_test(NAME netns.verl_backend
           COMMAND bash ${CMAKE_CURRENT_LIST_DIR}/verl_backend_netns.sh ${PROJECT_BINARY_DIR}/python
                   $<TARGET_PROPERTY:ferry_python,FERRY_PYTHON_EXECUTABLE>)
  set_tests_properties(netns.verl_backend PROPERTIES LABELS netns TIMEOUT 600
                                                     SKIP_RETURN_CODE 77 RUN_SERIAL TRUE)
  # The same shape under verl's own CheckpointEngineManager and worker classes, over a Ray
  # cluster of one node per namespace (about 30 s; the driver bounds itself at 300 s).
  add_test(NAME netns.verl_stack
           COMMAND bash ${CMAKE_CURRENT_LIST_DIR}/verl_stack_netns.sh ${PROJECT_BINARY_DIR}/python
                   $<TARGET_PROPERTY:ferry_python,FERRY_PYTHON_EXECUTABLE>)
  set_tests_properties(netns.verl_stack PROPERTIES LABELS netns TIMEOUT 600
                                                   SKIP_RETURN_CODE 77 RUN_SERIAL TRUE)
  # ferry.dcp with each node's ranks in a namespace of their own: a load's fetch of the shard
  # files its node lacks crosses the bridge (about 2 minutes; the driver bounds itself at
  # 240 s).
  add_test(NAME netns.dcp
           COMMAND bash ${CMAKE_CURRENT_LIST_DIR}/dcp_netns.sh ${PROJECT_BINARY_DIR}/python
                   $<TARGET_PROPERTY:ferry_python,FERRY_PYTHON_EXECUTABLE>)
  set_tests_properties(netns.dcp PROPERTIES LABELS netns TIMEOUT 300 SKIP_RETURN_CODE 77
                                            RUN_SERIAL TRUE)
endif()
