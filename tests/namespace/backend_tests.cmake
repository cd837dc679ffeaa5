# Functional tests of the namespace backend (runtime/namespace/namespace_backend.cpp): what a
# payload sees, the limits and their statuses, and that nothing outlives a run.
rlm_add_test(namespace_backend_tests
  ${CMAKE_CURRENT_SOURCE_DIR}/namespace_backend_test.cpp
  ${CMAKE_CURRENT_SOURCE_DIR}/namespace_backend_limits_test.cpp
  ${CMAKE_CURRENT_SOURCE_DIR}/namespace_backend_cleanup_test.cpp
  ${CMAKE_CURRENT_SOURCE_DIR}/namespace_backend_sigterm_test.cpp)
# The backend execs rlm-sandbox-init from the same bin directory; one test drives the CLI.
add_dependencies(namespace_backend_tests rlm-sandbox-init rlm-sandbox)
# namespace/namespace_backend.hpp is internal to the library.
target_link_libraries(namespace_backend_tests PRIVATE rlm_sandbox_internals)
# What a Result comes to as the CLI's exit status.
target_link_libraries(namespace_backend_tests PRIVATE rlm_cli_exit_status)
