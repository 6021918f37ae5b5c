# The man page (help2man) and bash completion, generated from the built CLI's --help by
# scripts/gen_cli_docs.py, so they list exactly the commands and options the binary has.
# `cmake --install` puts them in share/man/man1 and share/bash-completion/completions.
# Sanitizer builds (never installed) skip them: running their binary at build time would put
# LeakSanitizer's verdict on `ferry --help` into the build.
if(FERRY_SANITIZE)
  return()
endif()
find_package(Python3 REQUIRED COMPONENTS Interpreter)
find_program(FERRY_HELP2MAN help2man)

set(FERRY_COMPLETION ${PROJECT_BINARY_DIR}/share/bash-completion/completions/ferry)
set(FERRY_MAN_PAGE ${PROJECT_BINARY_DIR}/share/man/man1/ferry.1)
set(FERRY_CLI_DOCS ${FERRY_COMPLETION})
set(FERRY_MAN_ARGS)
if(FERRY_HELP2MAN)
  list(APPEND FERRY_CLI_DOCS ${FERRY_MAN_PAGE})
  set(FERRY_MAN_ARGS --man ${FERRY_MAN_PAGE} --help2man ${FERRY_HELP2MAN})
else()
  message(STATUS "help2man not found: no man page (scripts/install-deps.sh installs it)")
endif()

add_custom_command(
  OUTPUT ${FERRY_CLI_DOCS}
  COMMAND ${Python3_EXECUTABLE} ${PROJECT_SOURCE_DIR}/scripts/gen_cli_docs.py
          --ferry $<TARGET_FILE:ferry_cli> --completion ${FERRY_COMPLETION} ${FERRY_MAN_ARGS}
  DEPENDS ferry_cli ${PROJECT_SOURCE_DIR}/scripts/gen_cli_docs.py
  COMMENT "Generating the ferry man page and bash completion from --help" VERBATIM)
add_custom_target(ferry_cli_docs ALL DEPENDS ${FERRY_CLI_DOCS})

install(FILES ${FERRY_COMPLETION} DESTINATION ${CMAKE_INSTALL_DATADIR}/bash-completion/completions)
if(FERRY_HELP2MAN)
  install(FILES ${FERRY_MAN_PAGE} DESTINATION ${CMAKE_INSTALL_MANDIR}/man1)
endif()
