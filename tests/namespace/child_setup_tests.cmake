# The child's setup steps (runtime/namespace/child_setup.hpp) against the real kernel: each test
# builds a sandbox the way the namespace backend does and checks it from inside.
rlm_add_test(child_setup_tests
  ${CMAKE_CURRENT_SOURCE_DIR}/child_setup_harness.cpp
  ${CMAKE_CURRENT_SOURCE_DIR}/rootfs_test.cpp
  ${CMAKE_CURRENT_SOURCE_DIR}/loopback_test.cpp
  ${CMAKE_CURRENT_SOURCE_DIR}/privileges_test.cpp)
target_link_libraries(child_setup_tests PRIVATE rlm_sandbox_internals)

# Run inside the sandbox (bound at /probe, or exec'd by fd like rlm-sandbox-init). Static like
# init, so it needs nothing from the sandbox's /usr (sanitizer runtimes cannot be linked
# statically; that build relies on the default policy's /usr and /lib64).
add_executable(child_setup_probe ${CMAKE_CURRENT_SOURCE_DIR}/child_setup_probe.cpp)
if(NOT RLM_SANITIZE)
  target_link_options(child_setup_probe PRIVATE -static)
endif()
add_dependencies(child_setup_tests child_setup_probe)
