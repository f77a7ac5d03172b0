"""Builds liboptireduce with the repository's meson build (the release configuration in the
repository's build/ directory, the one `bash .ci/setup` makes) and puts the library inside the
package, so an installed package needs nothing from the source tree."""

import os
import shutil
import subprocess

from setuptools import setup
from setuptools.command.build_py import build_py
from setuptools.dist import Distribution

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(HERE)
BUILD = os.path.join(REPO, "build")
LIB = os.path.join(BUILD, "collectives", "liboptireduce.so")


class BuildWithLibrary(build_py):
    def run(self):
        if not os.path.isfile(os.path.join(BUILD, "build.ninja")):
            subprocess.check_call(["meson", "setup", BUILD, "-Dbuildtype=release",
                                   "-Db_sanitize=none", "-Db_lundef=true"], cwd=REPO)
        subprocess.check_call(["ninja", "-C", BUILD, "collectives/liboptireduce.so"])
        super().run()
        dest = os.path.join(self.build_lib, "optireduce", "lib")
        os.makedirs(dest, exist_ok=True)
        # The real file under the unversioned name the package loads (no symlinks in a wheel).
        shutil.copyfile(os.path.realpath(LIB), os.path.join(dest, "liboptireduce.so"))


class BinaryDistribution(Distribution):
    """The wheel holds a native library: tag it for this platform, not py3-none-any."""

    def has_ext_modules(self):
        return True


setup(cmdclass={"build_py": BuildWithLibrary}, distclass=BinaryDistribution)
