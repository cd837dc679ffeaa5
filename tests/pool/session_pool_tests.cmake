# Warm REPL sessions (runtime/pool/session_pool.cpp) in real sandboxes, and through rlm::Pool.
rlm_add_test(session_pool_tests ${CMAKE_CURRENT_LIST_DIR}/session_pool_test.cpp)
target_link_libraries(session_pool_tests PRIVATE rlm_sandbox_internals)
