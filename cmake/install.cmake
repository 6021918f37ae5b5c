include(CMakePackageConfigHelpers)

install(TARGETS ferry EXPORT ferryTargets
        LIBRARY DESTINATION ${CMAKE_INSTALL_LIBDIR}
        ARCHIVE DESTINATION ${CMAKE_INSTALL_LIBDIR}
        RUNTIME DESTINATION ${CMAKE_INSTALL_BINDIR})
install(DIRECTORY include/ferry DESTINATION ${CMAKE_INSTALL_INCLUDEDIR})
install(EXPORT ferryTargets NAMESPACE ferry:: DESTINATION ${CMAKE_INSTALL_LIBDIR}/cmake/ferry)

configure_package_config_file(cmake/ferryConfig.cmake.in ${PROJECT_BINARY_DIR}/ferryConfig.cmake
                              INSTALL_DESTINATION ${CMAKE_INSTALL_LIBDIR}/cmake/ferry)
write_basic_package_version_file(${PROJECT_BINARY_DIR}/ferryConfigVersion.cmake
                                 COMPATIBILITY SameMinorVersion)
install(FILES ${PROJECT_BINARY_DIR}/ferryConfig.cmake ${PROJECT_BINARY_DIR}/ferryConfigVersion.cmake
        DESTINATION ${CMAKE_INSTALL_LIBDIR}/cmake/ferry)

file(RELATIVE_PATH FERRY_PC_TO_PREFIX "/${CMAKE_INSTALL_LIBDIR}/pkgconfig" "/")
configure_file(cmake/ferry.pc.in ${PROJECT_BINARY_DIR}/ferry.pc @ONLY)
install(FILES ${PROJECT_BINARY_DIR}/ferry.pc DESTINATION ${CMAKE_INSTALL_LIBDIR}/pkgconfig)
