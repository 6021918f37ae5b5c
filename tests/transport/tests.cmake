# The net tests once more on UCX's path (FERRY_NET_PATH=ucx): the run registered by
# tests/CMakeLists.txt is on ferry's own TCP path, the default. UCX's path is meant for RDMA,
# which CI machines lack, and UCX's shared-memory transports cannot report a dead peer, so in
# this run the binary gives UCX its TCP transport (UCX_TLS=tcp, net_tcp_path_test.cc), as a
# user without RDMA forcing it would.
gtest_discover_tests(transport_test DISCOVERY_TIMEOUT 120 TEST_PREFIX "transport.ucx."
                     TEST_FILTER "Net*:Transports/Conformance.*/net:-NetExposure*"
                     PROPERTIES LABELS transport
                                ENVIRONMENT FERRY_NET_PATH=ucx)
