#!/usr/bin/env python3
"""The module graph is enforced by the build (runtime/CMakeLists.txt, rlm_module).

Copies the source tree to a scratch directory, adds to modules source files that include headers
the graph forbids them (a backend including another backend, pool/ or server/ including a backend's
private header, a module below server/ including server/) and headers it allows, configures the
copy once and compiles each of those files: every forbidden include must fail to compile with the
header not found, every allowed one must compile (so the check could fail). Also: no source below
runtime/ includes through "..", which would step around the include views.

usage: module_boundaries.py SOURCE_DIR SCRATCH_DIR [cmake args...]
"""
import json
import pathlib
import re
import shutil
import subprocess
import sys

# (module, header it includes, whether the graph allows it)
PROBES = [
    ("docker", "namespace/namespace_backend.hpp", False),
    ("namespace", "docker/docker_backend.hpp", False),
    ("landlock_backend", "local/local_backend.hpp", False),
    ("local", "landlock_backend/landlock_backend.hpp", False),
    ("pool", "namespace/namespace_backend.hpp", False),
    ("server", "namespace/mounts.hpp", False),
    ("server", "landlock_backend/confinement.hpp", False),
    ("session", "server/wire.hpp", False),
    ("broker", "server/peer.hpp", False),
    ("supervisor", "server/listener.hpp", False),
    ("host", "supervisor/launch.hpp", False),
    # Allowed, so a probe that fails for another reason is seen.
    ("namespace", "supervisor/launch.hpp", True),
    ("pool", "session/worker_session.hpp", True),
    ("server", "session/channel.hpp", True),
    ("registry", "namespace/namespace_backend.hpp", True),
]


def probe_name(index):
    return f"zz_boundary_probe_{index}.cpp"


def copy_tree(source, scratch):
    listed = subprocess.run(
        ["git", "-C", str(source), "ls-files", "-z", "--cached", "--others", "--exclude-standard"],
        check=True, capture_output=True).stdout.split(b"\0")
    for name in filter(None, listed):
        relative = pathlib.Path(name.decode())
        origin = source / relative
        if not origin.is_file() or relative.parts[0] == "tests":
            continue
        target = scratch / relative
        target.parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(origin, target)
    # The copy has no tests/ (they are not part of the graph), so the option must not ask for them.
    return scratch


def dot_dot_includes(source):
    found = []
    for path in sorted((source / "runtime").rglob("*.[ch]pp")):
        for number, line in enumerate(path.read_text(errors="replace").splitlines(), 1):
            if re.match(r'\s*#\s*include\s*"(\.\./|/)', line):
                found.append(f"{path.relative_to(source)}:{number}: {line.strip()}")
    return found


def main():
    source = pathlib.Path(sys.argv[1]).resolve()
    scratch = pathlib.Path(sys.argv[2]).resolve()
    cmake_args = sys.argv[3:]
    failures = [f"includes through '..' or an absolute path: {line}" for line in dot_dot_includes(source)]

    shutil.rmtree(scratch, ignore_errors=True)
    copy_tree(source, scratch / "src")
    for index, (module, header, _) in enumerate(PROBES):
        folder = scratch / "src" / "runtime" / module
        assert folder.is_dir(), f"no module folder runtime/{module}"
        (folder / probe_name(index)).write_text(f'#include "{header}"\n')
        with open(folder / "CMakeLists.txt", "a") as cmake_file:
            cmake_file.write(f"\ntarget_sources(rlm_module_{module} PRIVATE {probe_name(index)})\n")

    build = scratch / "build"
    configure = subprocess.run(
        ["cmake", "-S", str(scratch / "src"), "-B", str(build), "-G", "Ninja",
         "-DRLM_BUILD_TESTS=OFF", "-DCMAKE_EXPORT_COMPILE_COMMANDS=ON", *cmake_args], capture_output=True, text=True)
    if configure.returncode != 0:
        print(configure.stdout, configure.stderr, sep="\n")
        sys.exit("the scratch copy does not configure")

    # Each probe is compiled with the command the build gives it (compile_commands.json), one at
    # a time: asking ninja for one object would also build the objects of the modules it depends
    # on, so one refused probe would stop another's check.
    commands = {pathlib.Path(entry["file"]).name: entry
                for entry in json.loads((build / "compile_commands.json").read_text())
                if pathlib.Path(entry["file"]).name.startswith("zz_boundary_probe_")}
    for index, (module, header, allowed) in enumerate(PROBES):
        entry = commands[probe_name(index)]
        built = subprocess.run(entry["command"], shell=True, cwd=entry["directory"],
                               capture_output=True, text=True)
        output = built.stdout + built.stderr
        what = f"runtime/{module} including {header}"
        if allowed and built.returncode != 0:
            failures.append(f"{what} is allowed but did not compile:\n{output}")
        elif not allowed and built.returncode == 0:
            failures.append(f"{what} crosses the module graph but compiled")
        elif not allowed and f"{header}: No such file or directory" not in output:
            failures.append(f"{what} failed, but not because the header is out of sight:\n{output}")
        else:
            print(f"ok: {what}: {'compiles' if allowed else 'refused by the build'}")

    if failures:
        print("\n\n".join(failures))
        sys.exit(1)
    shutil.rmtree(scratch, ignore_errors=True)


if __name__ == "__main__":
    main()
