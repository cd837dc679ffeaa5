# The .deb (cpack -G DEB in a build configured for /usr: tools/package does it with Debian's own
# flags). One package, rlm-sandbox, with everything `cmake --install` puts under the prefix.
set(CPACK_PACKAGE_NAME rlm-sandbox)
set(CPACK_PACKAGE_VENDOR "rlm-sandbox")
set(CPACK_PACKAGE_CONTACT "rlm-sandbox maintainers <rlm-sandbox@users.noreply.github.com>")
set(CPACK_PACKAGE_VERSION ${PROJECT_VERSION})
set(CPACK_PACKAGE_DESCRIPTION_SUMMARY "hardened Linux sandbox runtime for untrusted code")
set(CPACK_PACKAGE_DESCRIPTION
    "rlm-sandbox runs code it does not trust (code a language model writes in a Recursive-Language-Model loop, a CI job) under one JSON policy: user, PID, network, mount, IPC and UTS namespaces, seccomp, cgroup limits, no capabilities; every run ends in one precise Result. Includes the rlm-sandbox CLI, rlm-sandbox-init, the librlm_sandbox library with headers, CMake and pkg-config files, the shipped policies, the man page and the server's systemd units.")
set(CPACK_PACKAGING_INSTALL_PREFIX ${CMAKE_INSTALL_PREFIX})
set(CPACK_GENERATOR DEB)
# As Debian ships binaries: stripped (the debug info of a -g build is most of its size).
set(CPACK_STRIP_FILES ON)
set(CPACK_PACKAGE_FILE_NAME "rlm-sandbox_${PROJECT_VERSION}_amd64")
set(CPACK_DEBIAN_FILE_NAME DEB-DEFAULT)
set(CPACK_DEBIAN_PACKAGE_SECTION utils)
set(CPACK_DEBIAN_PACKAGE_PRIORITY optional)
set(CPACK_DEBIAN_PACKAGE_HOMEPAGE "https://github.com/rlm-sandbox/rlm-sandbox")
# The shared libraries the binaries and librlm_sandbox.so load, from dpkg-shlibdeps; then what
# runs without being linked: python3 in the sandbox for sessions (the policies bind the host's
# /usr), and the -dev packages the headers, .pc and CMake files name (recommended only: the CLI
# needs none of them).
set(CPACK_DEBIAN_PACKAGE_SHLIBDEPS ON)
set(CPACK_DEBIAN_PACKAGE_DEPENDS "")
set(CPACK_DEBIAN_PACKAGE_RECOMMENDS "python3")
set(CPACK_DEBIAN_PACKAGE_SUGGESTS
    "nlohmann-json3-dev, libseccomp-dev, libcap-dev, libnl-3-dev, libnl-route-3-dev, libcurl4-openssl-dev, libssl-dev, docker.io")
set(CPACK_DEBIAN_PACKAGE_GENERATE_SHLIBS ON)
# The postinst makes the socket's group; the server's configuration under /etc is the
# administrator's once installed (a conffile).
set(CPACK_DEBIAN_PACKAGE_CONTROL_EXTRA ${CMAKE_CURRENT_SOURCE_DIR}/deb/postinst)
if(DEFINED RLM_SANDBOX_CONFIG_DIR AND IS_ABSOLUTE "${RLM_SANDBOX_CONFIG_DIR}")
  file(WRITE ${CMAKE_CURRENT_BINARY_DIR}/deb/conffiles "${RLM_SANDBOX_CONFIG_DIR}/server.json\n")
  list(APPEND CPACK_DEBIAN_PACKAGE_CONTROL_EXTRA ${CMAKE_CURRENT_BINARY_DIR}/deb/conffiles)
endif()
set(CPACK_DEBIAN_PACKAGE_CONTROL_STRICT_PERMISSION ON)
set(CPACK_SOURCE_IGNORE_FILES "/build[^/]*/;/\\\\.git/")
include(CPack)
