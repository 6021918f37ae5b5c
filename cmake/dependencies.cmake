# Every dependency is a Debian package (see README.md for the list).
find_package(Threads REQUIRED)
find_package(fmt REQUIRED)
find_package(spdlog REQUIRED)
find_package(nlohmann_json 3.10 REQUIRED)
find_package(CLI11 REQUIRED)
find_package(yaml-cpp REQUIRED)
find_package(PkgConfig REQUIRED)
pkg_check_modules(XXHASH REQUIRED IMPORTED_TARGET libxxhash)

# Private dependencies of libferry: never exposed through include/ferry/.
add_library(ferry_deps INTERFACE)
target_link_libraries(ferry_deps INTERFACE Threads::Threads fmt::fmt spdlog::spdlog
                                           nlohmann_json::nlohmann_json PkgConfig::XXHASH)
