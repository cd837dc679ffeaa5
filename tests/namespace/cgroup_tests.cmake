# cgroup tests: run as root against this host's real hierarchies (v1 here; v2 in the VM:
# ../shared/tools/cgroup2-vm --rw BUILD -- BUILD/bin/cgroup_tests). docs/cgroups.md.
rlm_add_test(cgroup_tests
  ${CMAKE_CURRENT_SOURCE_DIR}/cgroup_lifecycle_test.cpp
  ${CMAKE_CURRENT_SOURCE_DIR}/cgroup_limits_test.cpp
  ${CMAKE_CURRENT_SOURCE_DIR}/cgroup_parse_test.cpp
  ${CMAKE_CURRENT_SOURCE_DIR}/cgroup_placement_test.cpp
  ${CMAKE_CURRENT_SOURCE_DIR}/cgroup_stale_test.cpp)
# namespace/cgroup*.hpp are internal to the library.
target_include_directories(cgroup_tests PRIVATE ${PROJECT_SOURCE_DIR}/runtime)
