"""`import zmuon` in an interpreter without numpy and without torch (neither is needed to
import): Debian's python3 isolated (-I) and without site packages (-S), the package and the
built library given by path. The test first proves that numpy and torch are out of reach."""

import os
import subprocess
import sys
import unittest

PACKAGE = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "python")


def bare(code):
    """Runs `code` in a bare interpreter with the package on sys.path."""
    prelude = f"import sys; sys.path.insert(0, {os.path.abspath(PACKAGE)!r})\n"
    return subprocess.run([sys.executable, "-I", "-S", "-c", prelude + code],
                          capture_output=True, text=True, timeout=120,
                          env={"ZMUON_LIBRARY": os.environ["ZMUON_LIBRARY"]})


class ImportWithoutNumpyOrTorch(unittest.TestCase):

    def test_the_interpreter_has_neither(self):
        for module in ("numpy", "torch"):
            r = bare(f"import {module}")
            self.assertNotEqual(r.returncode, 0, f"{module} is importable: the test proves "
                                "nothing")
            self.assertIn("ModuleNotFoundError", r.stderr)

    def test_import_zmuon(self):
        r = bare("import zmuon\n"
                 "assert 'numpy' not in sys.modules and 'torch' not in sys.modules\n"
                 "print(zmuon.version(), zmuon.Muon.__mro__[-1].__name__)")
        self.assertEqual(r.returncode, 0, r.stderr)
        print(f"\nbare interpreter: zmuon {r.stdout.strip()}")
        self.assertTrue(r.stdout.strip().endswith(" object"))  # the plain class, no torch


if __name__ == "__main__":
    unittest.main()
