# cgroups v2 and v1 for the namespace backend (cgroup.hpp); docs/cgroups.md explains the layout.
target_sources(rlm_sandbox PRIVATE
  cgroup.cpp             # v2 or v1; the probe behind `health`
  cgroup_detect.cpp      # mountinfo, /proc/self/cgroup
  cgroup_fs.cpp          # control files, the kill loop, removal
  cgroup_group_dirs.cpp  # teardown shared by v1 and v2
  cgroup_run_id.cpp      # run ids that name their owner process
  cgroup_stale.cpp       # groups left by dead owners
  cgroup_v1.cpp
  cgroup_v2.cpp
  cgroup_v2_parent.cpp)  # where the v2 parent may go
