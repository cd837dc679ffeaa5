# Per-sandbox host uids (runtime/host/sandbox_uid.cpp): the allocator's slots, and real
# sandboxes exhausting per-user kernel counters while others and the host keep theirs.
rlm_add_test(namespace_uid_tests ${CMAKE_CURRENT_SOURCE_DIR}/sandbox_uid_test.cpp
  ${CMAKE_CURRENT_SOURCE_DIR}/sandbox_uid_slot_test.cpp)
add_dependencies(namespace_uid_tests rlm-sandbox-init)
target_link_libraries(namespace_uid_tests PRIVATE rlm_sandbox_internals)
