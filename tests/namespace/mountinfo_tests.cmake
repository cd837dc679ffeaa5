# The host's mount table as the backend reads it (sysutil/mountinfo.cpp): cached, never stale.
rlm_add_test(mountinfo_tests ${CMAKE_CURRENT_SOURCE_DIR}/mountinfo_cache_test.cpp)
target_link_libraries(mountinfo_tests PRIVATE rlm_sys)
