"""python/build_backend (the in-tree PEP 517 backend): the wheel holds every module of the
package and of its subpackages (a directory with __init__.py) and nothing else, its RECORD's
hashes and sizes are right, its metadata is pyproject.toml's, and the sdist rebuilds the same
wheel with nothing but itself."""

import base64
import csv
import hashlib
import importlib
import io
import os
import shutil
import sys
import tarfile
import tempfile
import unittest
import zipfile

SOURCE = os.path.join(os.environ["RLM_SANDBOX_SOURCE_DIR"], "python")


def load_backend(root):
    sys.path.insert(0, os.path.join(root, "build_backend"))
    try:
        sys.modules.pop("rlm_sandbox_build", None)
        return importlib.import_module("rlm_sandbox_build")
    finally:
        sys.path.pop(0)


class BuildBackendTest(unittest.TestCase):
    def setUp(self):
        self.tmp = tempfile.mkdtemp(prefix="rlm-backend-test.")
        self.addCleanup(shutil.rmtree, self.tmp)
        self.root = os.path.join(self.tmp, "python")
        shutil.copytree(SOURCE, self.root, ignore=shutil.ignore_patterns("__pycache__"))
        # A subpackage two levels down, and a directory that is not a package.
        os.makedirs(os.path.join(self.root, "rlm_sandbox", "extra", "deeper"))
        for name in ("extra/__init__.py", "extra/deeper/__init__.py", "extra/deeper/mod.py"):
            with open(os.path.join(self.root, "rlm_sandbox", name), "w") as stream:
                stream.write("VALUE = 1\n")
        os.makedirs(os.path.join(self.root, "rlm_sandbox", "notes"))
        with open(os.path.join(self.root, "rlm_sandbox", "notes", "stray.py"), "w") as stream:
            stream.write("")
        self.out = os.path.join(self.tmp, "out")
        os.makedirs(self.out)

    def wheel_members(self, backend):
        name = backend.build_wheel(self.out)
        with zipfile.ZipFile(os.path.join(self.out, name)) as wheel:
            return name, {info.filename: wheel.read(info) for info in wheel.infolist()}

    def test_wheel_holds_every_subpackage_and_a_true_record(self):
        backend = load_backend(self.root)
        name, members = self.wheel_members(backend)
        self.assertEqual(name, "rlm_sandbox-0.1.0-py3-none-any.whl")
        modules = sorted(m for m in members if m.startswith("rlm_sandbox/"))
        expected = sorted(
            os.path.relpath(os.path.join(d, f), self.root).replace(os.sep, "/")
            for d, _, files in os.walk(os.path.join(self.root, "rlm_sandbox"))
            if "notes" not in d for f in files if f.endswith(".py") or f == "py.typed")
        self.assertEqual(modules, expected)
        self.assertIn("rlm_sandbox/extra/deeper/mod.py", modules)
        self.assertNotIn("rlm_sandbox/notes/stray.py", modules)
        record = members["rlm_sandbox-0.1.0.dist-info/RECORD"].decode()
        rows = list(csv.reader(io.StringIO(record)))
        self.assertEqual(sorted(r[0] for r in rows), sorted(members))
        for path, digest, size in rows:
            if path.endswith("RECORD"):
                continue
            data = members[path]
            expected_digest = base64.urlsafe_b64encode(
                hashlib.sha256(data).digest()).rstrip(b"=").decode()
            self.assertEqual((digest, size), ("sha256=" + expected_digest, str(len(data))), path)
        metadata = members["rlm_sandbox-0.1.0.dist-info/METADATA"].decode()
        self.assertIn("Name: rlm-sandbox\n", metadata)
        self.assertIn("Requires-Python: >=3.9\n", metadata)

    def test_sdist_builds_the_same_wheel_alone(self):
        backend = load_backend(self.root)
        _, from_tree = self.wheel_members(backend)
        sdist = backend.build_sdist(self.out)
        unpacked = os.path.join(self.tmp, "unpacked")
        with tarfile.open(os.path.join(self.out, sdist)) as tar:
            if hasattr(tarfile, "data_filter"):
                tar.extractall(unpacked, filter="data")
            else:
                tar.extractall(unpacked)
        again = load_backend(os.path.join(unpacked, "rlm_sandbox-0.1.0"))
        os.remove(os.path.join(self.out, "rlm_sandbox-0.1.0-py3-none-any.whl"))
        _, from_sdist = self.wheel_members(again)
        self.assertEqual(from_sdist, from_tree)


if __name__ == "__main__":
    unittest.main()
