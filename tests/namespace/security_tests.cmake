# Security and acceptance suite of the namespace backend: escape attempts from inside the default
# sandbox (security_escape_*_test.cpp: through the filesystem, the network, and processes and the
# kernel), resource attacks with deadlines (security_limits_test.cpp)
# and leftovers after many runs (security_cleanup_test.cpp). docs/security.md maps each property
# of the threat model to its test.
rlm_add_test(namespace_security_tests
  ${CMAKE_CURRENT_SOURCE_DIR}/security_escape_filesystem_test.cpp
  ${CMAKE_CURRENT_SOURCE_DIR}/security_escape_network_test.cpp
  ${CMAKE_CURRENT_SOURCE_DIR}/security_escape_process_test.cpp
  ${CMAKE_CURRENT_SOURCE_DIR}/security_escape_landlock_test.cpp
  ${CMAKE_CURRENT_SOURCE_DIR}/security_pool_reuse_test.cpp)
add_dependencies(namespace_security_tests rlm-sandbox rlm-sandbox-init)

# These load the machine and assert deadlines, so no other test may run beside them.
add_executable(namespace_security_serial_tests
  ${CMAKE_CURRENT_SOURCE_DIR}/security_limits_test.cpp
  ${CMAKE_CURRENT_SOURCE_DIR}/security_cleanup_test.cpp)
target_link_libraries(namespace_security_serial_tests PRIVATE rlm_sandbox rlm_sandbox_http rlm_test_support
                                                              GTest::gtest_main Threads::Threads
                                                              rlm_cli_exit_status)
gtest_discover_tests(namespace_security_serial_tests DISCOVERY_TIMEOUT 60
                     PROPERTIES TIMEOUT 600 RUN_SERIAL TRUE)
add_dependencies(namespace_security_serial_tests rlm-sandbox rlm-sandbox-init)

# The same escape and limit tests through `rlm-sandbox serve` (RLM_SECURITY_BACKEND=server: each
# test process starts a server, security_test_util.hpp), as ctest names via_server.<Suite.Test>
# with the label via_server. The cleanup tests count machine-wide state and stay direct only.
# Registered once the server client is part of the build (issue 12's server part).
if(EXISTS ${PROJECT_SOURCE_DIR}/runtime/include/rlm_sandbox/client.hpp)
  gtest_discover_tests(namespace_security_tests DISCOVERY_TIMEOUT 60 TEST_PREFIX via_server.
                       PROPERTIES TIMEOUT 300 LABELS via_server
                                  ENVIRONMENT RLM_SECURITY_BACKEND=server)
  gtest_discover_tests(namespace_security_serial_tests DISCOVERY_TIMEOUT 60
                       TEST_PREFIX via_server. TEST_FILTER NamespaceTest.*
                       PROPERTIES TIMEOUT 600 RUN_SERIAL TRUE LABELS via_server
                                  ENVIRONMENT RLM_SECURITY_BACKEND=server)
  # And on a recycled sandbox (RLM_SECURITY_BACKEND=recycled: a server pool of one sandbox with
  # recycle, which serves 50 runs that try to leave something behind before each test), as
  # via_recycled.<Suite.Test> with the label via_recycled.
  gtest_discover_tests(namespace_security_tests DISCOVERY_TIMEOUT 60 TEST_PREFIX via_recycled.
                       PROPERTIES TIMEOUT 300 LABELS via_recycled
                                  ENVIRONMENT RLM_SECURITY_BACKEND=recycled)
  gtest_discover_tests(namespace_security_serial_tests DISCOVERY_TIMEOUT 60
                       TEST_PREFIX via_recycled. TEST_FILTER NamespaceTest.*
                       PROPERTIES TIMEOUT 600 RUN_SERIAL TRUE LABELS via_recycled
                                  ENVIRONMENT RLM_SECURITY_BACKEND=recycled)
  # And through the server's TLS listener (RLM_SECURITY_BACKEND=tls: certificates made for the
  # test, stdio streamed instead of passed), as via_tls.<Suite.Test> with the label via_tls.
  gtest_discover_tests(namespace_security_tests DISCOVERY_TIMEOUT 60 TEST_PREFIX via_tls.
                       PROPERTIES TIMEOUT 300 LABELS via_tls
                                  ENVIRONMENT RLM_SECURITY_BACKEND=tls)
  gtest_discover_tests(namespace_security_serial_tests DISCOVERY_TIMEOUT 60
                       TEST_PREFIX via_tls. TEST_FILTER NamespaceTest.*
                       PROPERTIES TIMEOUT 600 RUN_SERIAL TRUE LABELS via_tls
                                  ENVIRONMENT RLM_SECURITY_BACKEND=tls)
endif()
