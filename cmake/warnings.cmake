# Warnings and sanitizers, applied to every ferry target.
function(ferry_set_warnings target)
  target_compile_options(${target} PRIVATE -Wall -Wextra -Wpedantic -Wshadow -Wnon-virtual-dtor
                                           -Wno-missing-field-initializers)
  if(FERRY_WERROR)
    target_compile_options(${target} PRIVATE -Werror)
  endif()
  # Lock contracts (base/thread_annotations.h) are checked by clang only (the fuzz build);
  # a broken one fails the build even without FERRY_WERROR.
  if(CMAKE_CXX_COMPILER_ID STREQUAL "Clang")
    target_compile_options(${target} PRIVATE -Wthread-safety -Werror=thread-safety)
  endif()
endfunction()

if(FERRY_SANITIZE STREQUAL "address")
  add_compile_options(-fsanitize=address,undefined -fno-omit-frame-pointer -fno-sanitize-recover=undefined)
  add_link_options(-fsanitize=address,undefined)
  # GCC's -Wmaybe-uninitialized is unreliable under the sanitizers (its manual says so) and
  # at -O1 fires inside libstdc++'s own <regex>; the sanitizers check the real thing.
  if(CMAKE_CXX_COMPILER_ID STREQUAL "GNU")
    add_compile_options(-Wno-maybe-uninitialized)
  endif()
elseif(FERRY_SANITIZE STREQUAL "thread")
  add_compile_options(-fsanitize=thread -fno-omit-frame-pointer)
  add_link_options(-fsanitize=thread)
elseif(NOT FERRY_SANITIZE STREQUAL "")
  message(FATAL_ERROR "FERRY_SANITIZE must be '', 'address' or 'thread', not '${FERRY_SANITIZE}'")
endif()

# Fuzz builds instrument every library for coverage; the fuzz targets add the driver.
if(FERRY_BUILD_FUZZ)
  add_compile_options(-fsanitize=fuzzer-no-link,address,undefined -fno-omit-frame-pointer)
  add_link_options(-fsanitize=address,undefined)
endif()
