# Multi-node weight sync in network namespaces (needs root; skipped otherwise).
add_test(NAME netns.sync COMMAND bash ${CMAKE_CURRENT_LIST_DIR}/sync_netns_test.sh
                                 $<TARGET_FILE:ferry_cli>)
set_tests_properties(netns.sync PROPERTIES LABELS netns TIMEOUT 600 SKIP_RETURN_CODE 77
                                           RUN_SERIAL TRUE)
