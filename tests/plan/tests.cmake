# plan_test links ferry_plan, a library beside libferry (as ferry_tools is), not a module of it.
if(TARGET plan_test)
  target_link_libraries(plan_test PRIVATE ferry_plan)
endif()
