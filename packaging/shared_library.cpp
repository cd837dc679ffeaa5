// librlm_sandbox.so is made of the build tree's static archives, linked whole
// (packaging/CMakeLists.txt); a shared library target needs one source of its own, and this is it.
