# The scale tier (`ctest -L scale`): full-depth models through the CLI. Each case holds
# several GB at once, so they run one at a time.
add_test(NAME scale.sync_convert COMMAND bash ${CMAKE_CURRENT_LIST_DIR}/sync_convert_scale.sh
                                         $<TARGET_FILE:ferry_cli>)
set_tests_properties(scale.sync_convert PROPERTIES LABELS scale TIMEOUT 900 RUN_SERIAL TRUE)
