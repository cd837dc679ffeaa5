"""rlm-sandbox(1) as built (packaging/man_page.cmake): it renders with no roff warning, and the
rendered page holds every line of `rlm-sandbox --help` and of each command's `--help`."""

import os
import re
import shutil
import subprocess
import unittest

CLI = os.environ["RLM_SANDBOX_BIN"]
MAN_PAGE = os.environ["RLM_MAN_PAGE"]


def help_text(*command):
    return subprocess.run([CLI, *command, "--help"], check=True, capture_output=True,
                          text=True).stdout


def normalized(text):
    return re.sub(r"\s+", " ", text).strip()


class ManPageTest(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        if shutil.which("groff") is None:
            raise unittest.SkipTest("groff is not installed (apt-get install groff-base)")
        rendered = subprocess.run(
            ["groff", "-man", "-Tutf8", "-ww", "-rLL=200n", "-P-cbou", MAN_PAGE],
            check=True, capture_output=True, text=True, env={**os.environ, "LC_ALL": "C.UTF-8"})
        cls.warnings = rendered.stderr
        # groff's utf8 device writes '-' as U+2010 or U+2212 in places; the page says '\-'.
        cls.page = normalized(rendered.stdout.replace("\u2212", "-").replace("\u2010", "-"))

    def test_renders_without_warnings(self):
        self.assertEqual(self.warnings, "")

    def test_header_names_the_command_and_version(self):
        version = subprocess.run([CLI, "--version"], check=True, capture_output=True,
                                 text=True).stdout.split()[-1]
        with open(MAN_PAGE, encoding="utf-8") as stream:
            source = stream.read()
        self.assertIn('.TH RLM\\-SANDBOX 1 "" "rlm-sandbox %s"' % version, source)
        self.assertTrue("NAME rlm-sandbox - run code you do not trust" in self.page, self.page[:300])

    def test_every_help_line_is_in_the_page(self):
        top = help_text()
        commands = re.search(r"\ncommands:\n((?: +[a-z][a-z-]* +.*\n)+)", top)
        self.assertIsNotNone(commands, "no commands: section in --help")
        names = [line.split()[0] for line in commands.group(1).splitlines()]
        self.assertIn("run", names)
        for command in [[]] + [[name] for name in names]:
            for line in help_text(*command).splitlines():
                if line.strip():
                    with self.subTest(command=command, line=line):
                        self.assertTrue(normalized(line) in self.page, "not in the man page")
        for name in names:
            self.assertTrue("rlm-sandbox " + name in self.page, name + " has no section")


if __name__ == "__main__":
    unittest.main()
