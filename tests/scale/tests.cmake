# Scale tier (ctest -L scale): full-depth model shapes through the CLI, bit-exact.
# Each case is one script taking the ferry binary; add more beside ckpt_scale.sh.
add_test(NAME scale.ckpt COMMAND bash ${CMAKE_CURRENT_LIST_DIR}/ckpt_scale.sh $<TARGET_FILE:ferry_cli>)
set_tests_properties(scale.ckpt PROPERTIES LABELS scale TIMEOUT 300 RUN_SERIAL TRUE)
