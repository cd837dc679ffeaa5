"""A PEP 517 build backend for the rlm_sandbox package, standard library only.

pip builds a package in an isolated environment and first installs the backend that
pyproject.toml names; with PyPI unreachable, setuptools cannot be installed there. This backend is
in the tree (``backend-path``), so ``pip install ./python`` needs nothing from the network.

It packs every ``.py`` file of ``rlm_sandbox/`` and of each subpackage below it (a directory
with an ``__init__.py``), with the metadata of pyproject.toml's ``[project]`` table (name,
version, description, requires-python, readme). Hooks: build_wheel, build_sdist,
prepare_metadata_for_build_wheel and build_editable (a ``.pth`` file naming this directory).
"""

from __future__ import annotations

import base64
import hashlib
import io
import os
import re
import tarfile
import zipfile
from typing import Dict, Iterator, List, Optional, Tuple

_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
_PACKAGE = "rlm_sandbox"
# Reproducible archives: every member gets this time (1980-01-01, the earliest a zip can hold).
_EPOCH = (1980, 1, 1, 0, 0, 0)


# ---- pyproject.toml ------------------------------------------------------------------------

def _project() -> Dict[str, str]:
    """The [project] table's string values (tomllib where there is one: Python 3.11+)."""
    path = os.path.join(_ROOT, "pyproject.toml")
    try:
        import tomllib  # type: ignore[import-not-found]
    except ImportError:
        tomllib = None
    if tomllib is not None:
        with open(path, "rb") as stream:
            table = tomllib.load(stream).get("project", {})
        return {key: value for key, value in table.items() if isinstance(value, str)}
    # Older Pythons: the simple `key = "value"` lines of the [project] table, which is all the
    # metadata here uses.
    values: Dict[str, str] = {}
    section = None
    with open(path, encoding="utf-8") as stream:
        for line in stream:
            line = line.strip()
            header = re.fullmatch(r"\[([^\]]+)\]", line)
            if header:
                section = header.group(1).strip()
                continue
            match = re.fullmatch(r'([A-Za-z0-9_-]+)\s*=\s*"((?:[^"\\]|\\.)*)"', line)
            if section == "project" and match:
                values[match.group(1)] = match.group(2).encode().decode("unicode_escape")
    return values


def _names() -> Tuple[str, str, Dict[str, str]]:
    project = _project()
    for key in ("name", "version"):
        if not project.get(key):
            raise ValueError(f"pyproject.toml: [project] needs a {key}")
    distribution = re.sub(r"[-_.]+", "_", project["name"]).lower()
    return distribution, project["version"], project


def _metadata(project: Dict[str, str]) -> bytes:
    lines = ["Metadata-Version: 2.1", f"Name: {project['name']}", f"Version: {project['version']}"]
    if project.get("description"):
        lines.append(f"Summary: {project['description']}")
    if project.get("requires-python"):
        lines.append(f"Requires-Python: {project['requires-python']}")
    body = ""
    readme = project.get("readme")
    if readme:
        lines.append("Description-Content-Type: text/markdown")
        with open(os.path.join(_ROOT, readme), encoding="utf-8") as stream:
            body = "\n" + stream.read()
    return ("\n".join(lines) + "\n" + body).encode("utf-8")


# ---- What is packed -------------------------------------------------------------------------

def _package_files() -> Iterator[str]:
    """Paths relative to _ROOT of every module of the package and its subpackages, sorted."""
    found: List[str] = []
    top = os.path.join(_ROOT, _PACKAGE)
    for directory, subdirectories, files in os.walk(top):
        subdirectories[:] = sorted(d for d in subdirectories
                                   if os.path.isfile(os.path.join(directory, d, "__init__.py")))
        for name in files:
            if name.endswith(".py") or name == "py.typed":
                found.append(os.path.relpath(os.path.join(directory, name), _ROOT))
    if os.path.join(_PACKAGE, "__init__.py") not in found:
        raise FileNotFoundError(f"{top}/__init__.py is missing")
    return iter(sorted(found))


def _read(relative: str) -> bytes:
    with open(os.path.join(_ROOT, relative), "rb") as stream:
        return stream.read()


# ---- Wheels ---------------------------------------------------------------------------------

def _dist_info(distribution: str, version: str) -> str:
    return f"{distribution}-{version}.dist-info"


def _dist_info_files(project: Dict[str, str]) -> Dict[str, bytes]:
    return {
        "METADATA": _metadata(project),
        "WHEEL": b"Wheel-Version: 1.0\nGenerator: rlm_sandbox_build\nRoot-Is-Purelib: true\n"
                 b"Tag: py3-none-any\n",
        "top_level.txt": f"{_PACKAGE}\n".encode(),
    }


def _write_wheel(directory: str, members: Dict[str, bytes]) -> str:
    distribution, version, project = _names()
    info = _dist_info(distribution, version)
    for name, data in _dist_info_files(project).items():
        members[f"{info}/{name}"] = data
    record_name = f"{info}/RECORD"
    record = io.StringIO()
    for name, data in members.items():
        digest = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()
        record.write(f"{name},sha256={digest},{len(data)}\n")
    record.write(f"{record_name},,\n")
    members[record_name] = record.getvalue().encode()
    wheel_name = f"{distribution}-{version}-py3-none-any.whl"
    with zipfile.ZipFile(os.path.join(directory, wheel_name), "w", zipfile.ZIP_DEFLATED) as wheel:
        for name, data in members.items():
            entry = zipfile.ZipInfo(name, _EPOCH)
            entry.external_attr = 0o644 << 16
            entry.compress_type = zipfile.ZIP_DEFLATED
            wheel.writestr(entry, data)
    return wheel_name


def get_requires_for_build_wheel(config_settings: Optional[dict] = None) -> List[str]:
    return []


def get_requires_for_build_sdist(config_settings: Optional[dict] = None) -> List[str]:
    return []


def get_requires_for_build_editable(config_settings: Optional[dict] = None) -> List[str]:
    return []


def prepare_metadata_for_build_wheel(metadata_directory: str,
                                     config_settings: Optional[dict] = None) -> str:
    distribution, version, project = _names()
    info = _dist_info(distribution, version)
    os.makedirs(os.path.join(metadata_directory, info), exist_ok=True)
    for name, data in _dist_info_files(project).items():
        with open(os.path.join(metadata_directory, info, name), "wb") as stream:
            stream.write(data)
    return info


def build_wheel(wheel_directory: str, config_settings: Optional[dict] = None,
                metadata_directory: Optional[str] = None) -> str:
    members = {path.replace(os.sep, "/"): _read(path) for path in _package_files()}
    return _write_wheel(wheel_directory, members)


def build_editable(wheel_directory: str, config_settings: Optional[dict] = None,
                   metadata_directory: Optional[str] = None) -> str:
    distribution, _, _ = _names()
    return _write_wheel(wheel_directory, {f"__editable__.{distribution}.pth": (_ROOT + "\n").encode()})


# ---- Source distributions -------------------------------------------------------------------

def build_sdist(sdist_directory: str, config_settings: Optional[dict] = None) -> str:
    distribution, version, project = _names()
    base = f"{distribution}-{version}"
    files = ["pyproject.toml", os.path.join("build_backend", "rlm_sandbox_build.py")]
    if project.get("readme"):
        files.append(project["readme"])
    files.extend(_package_files())
    members = {f"{base}/{path.replace(os.sep, '/')}": _read(path) for path in files}
    members[f"{base}/PKG-INFO"] = _metadata(project)
    name = f"{base}.tar.gz"
    with tarfile.open(os.path.join(sdist_directory, name), "w:gz", format=tarfile.PAX_FORMAT) as tar:
        for member, data in sorted(members.items()):
            entry = tarfile.TarInfo(member)
            entry.size = len(data)
            entry.mode = 0o644
            entry.mtime = 315532800  # 1980-01-01, as in the wheels
            tar.addfile(entry, io.BytesIO(data))
    return name
