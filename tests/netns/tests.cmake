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
