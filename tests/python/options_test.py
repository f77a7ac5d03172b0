"""The Python package's options: keyword arguments and OPTIREDUCE_* variables are validated,
and a bad value raises ValueError naming the option. Runs without PyTorch."""

import os
import subprocess
import sys
import unittest

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "python"))
LIB = sys.argv.pop(1) if len(sys.argv) > 1 else None

import optireduce  # noqa: E402
from optireduce import options  # noqa: E402


class Options(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        optireduce.load_library(LIB)
        for k in list(os.environ):
            if k.startswith("OPTIREDUCE_"):
                del os.environ[k]

    def test_keywords_override_the_defaults(self):
        o = options.describe(options.make_options(mode="bounded", incast="auto", hadamard=False,
                                                  hadamard_block=256, erasure="zero",
                                                  safeguard=0.25, safeguard_redo=True,
                                                  exact_below=0, nonfinite_agree=True,
                                                  allgather_mode="exact", gather_fill="own"))
        self.assertEqual(o, {"mode": "bounded", "incast": "auto", "hadamard": False,
                             "hadamard_block": 256, "erasure": "zero", "safeguard": 0.25,
                             "safeguard_redo": True, "exact_below": 0,
                             "nonfinite_agree": True, "allgather_mode": "exact",
                             "gather_fill": "own"})
        self.assertEqual(options.describe(options.make_options(incast=3))["incast"], 3)

    def test_none_keeps_the_library_default(self):
        d = options.describe(options.make_options())
        self.assertEqual(d["mode"], "exact")
        self.assertEqual(d["allgather_mode"], "started")
        self.assertEqual(d["gather_fill"], "zero")
        self.assertEqual(options.describe(options.make_options(mode=None)), d)

    def test_bad_keywords_name_the_option(self):
        bad = [("mode", "lossy"), ("incast", 0), ("incast", "most"), ("hadamard", 2),
               ("hadamard_block", 3), ("hadamard_block", 1), ("erasure", "drop"),
               ("safeguard", 1.5), ("safeguard", "x"), ("safeguard_redo", "yes"),
               ("exact_below", -1), ("exact_below", 1.5), ("nonfinite_agree", "on"),
               ("allgather_mode", "lossy"), ("gather_fill", "mean")]
        for name, value in bad:
            with self.subTest(name=name, value=value):
                with self.assertRaises(ValueError) as cm:
                    options.make_options(**{name: value})
                self.assertIn(name, str(cm.exception))
        with self.assertRaises(TypeError):
            options.make_options(colour="blue")
        for value in (-1, 1_000_001, 2.5, True, "20"):
            with self.subTest(name="resync_steps", value=value):
                with self.assertRaises(ValueError) as cm:
                    options.resync_steps(value)
                self.assertIn("resync_steps", str(cm.exception))

    def test_resync_steps_comes_from_the_argument_else_the_environment(self):
        self.assertEqual(options.resync_steps(), 20)
        self.assertEqual(options.resync_steps(0), 0)
        os.environ["OPTIREDUCE_RESYNC_STEPS"] = "7"
        try:
            self.assertEqual(options.resync_steps(), 7)
            self.assertEqual(options.resync_steps(3), 3)
            for raw in ("x", "-1", "2000000"):
                os.environ["OPTIREDUCE_RESYNC_STEPS"] = raw
                with self.assertRaises(ValueError) as cm:
                    options.resync_steps()
                self.assertIn("OPTIREDUCE_RESYNC_STEPS", str(cm.exception))
        finally:
            del os.environ["OPTIREDUCE_RESYNC_STEPS"]

    def test_environment_is_the_default_and_is_validated(self):
        code = ("import sys, optireduce; from optireduce import options; "
                "optireduce.load_library(sys.argv[1] or None); "
                "print(options.describe(options.make_options())['mode'])")
        env = dict(os.environ, PYTHONPATH=os.path.join(os.path.dirname(__file__), "..", "..", "python"))
        ok = subprocess.run([sys.executable, "-c", code, LIB or ""],
                            env=dict(env, OPTIREDUCE_ALLREDUCE_MODE="bounded"),
                            capture_output=True, text=True)
        self.assertEqual(ok.returncode, 0, ok.stderr)
        self.assertEqual(ok.stdout.strip(), "bounded")
        bad = subprocess.run([sys.executable, "-c", code, LIB or ""],
                             env=dict(env, OPTIREDUCE_HADAMARD_BLOCK="100"),
                             capture_output=True, text=True)
        self.assertNotEqual(bad.returncode, 0)
        self.assertIn("ValueError", bad.stderr)
        self.assertIn("OPTIREDUCE_HADAMARD_BLOCK", bad.stderr)


if __name__ == "__main__":
    unittest.main()
