# The scale tier (`ctest -L scale`): full-depth models through the CLI, bit-exact. Each case
# is one script taking the ferry binary and holds several GB at once, so they run one at a
# time.
add_test(NAME scale.ckpt COMMAND bash ${CMAKE_CURRENT_LIST_DIR}/ckpt_scale.sh $<TARGET_FILE:ferry_cli>)
set_tests_properties(scale.ckpt PROPERTIES LABELS scale TIMEOUT 600 RUN_SERIAL TRUE)
add_test(NAME scale.sync_convert COMMAND bash ${CMAKE_CURRENT_LIST_DIR}/sync_convert_scale.sh
                                         $<TARGET_FILE:ferry_cli>)
set_tests_properties(scale.sync_convert PROPERTIES LABELS scale TIMEOUT 900 RUN_SERIAL TRUE)
add_test(NAME scale.replicate COMMAND bash ${CMAKE_CURRENT_LIST_DIR}/replicate_scale.sh
                                      $<TARGET_FILE:ferry_cli>)
set_tests_properties(scale.replicate PROPERTIES LABELS scale TIMEOUT 300 RUN_SERIAL TRUE)
