"""Builds the ferry wheel: CMake builds libferry and the _ferry extension, setuptools packs them.

    pip install . --no-build-isolation        # Debian's setuptools and wheel, offline

The wheel's ferry/ holds the Python package, _ferry.*.so and libferry.so.<major> beside it
(the extension's RPATH includes $ORIGIN). The version is CMake's project() version, which is
also ferry.__version__, so the two cannot disagree.

Environment:
    FERRY_CMAKE_BUILD_DIR  the CMake build folder (default: one under setuptools' build_temp);
                           kept, so a second install rebuilds only what changed
    FERRY_CMAKE_ARGS       more cmake arguments, e.g. "-DCMAKE_CXX_COMPILER_LAUNCHER=ccache"
    FERRY_CMAKE_PREBUILT   instead: a configured build folder (with the Python module) to
                           take as it is; tests/install uses the test build's, so that the
                           test does not compile libferry a second time
    FERRY_JOBS             parallel compile jobs (default: the CPU count)
"""

import os
import pathlib
import re
import shlex
import shutil
import subprocess
import sys

from setuptools import Extension, setup
from setuptools.command.build_ext import build_ext

ROOT = pathlib.Path(__file__).resolve().parent


def project_version() -> str:
    text = (ROOT / "CMakeLists.txt").read_text()
    match = re.search(r"project\(\s*ferry\s+VERSION\s+([0-9][0-9.]*)", text)
    if match is None:
        raise RuntimeError("CMakeLists.txt: no `project(ferry VERSION x.y.z ...)` to take the version from")
    return match.group(1)


class CMakeBuild(build_ext):
    """Configures, builds and installs the CMake project into a staging folder, then copies
    the Python package with its extension and libferry into the wheel's ferry/."""

    def build_extension(self, ext: Extension) -> None:
        temp = pathlib.Path(self.build_temp).resolve()
        jobs = os.environ.get("FERRY_JOBS") or str(os.cpu_count() or 1)
        prebuilt = os.environ.get("FERRY_CMAKE_PREBUILT")
        if prebuilt:
            # A configured tree taken as it is: only what `cmake --install` needs is built.
            build_dir = pathlib.Path(prebuilt).resolve()
            if not (build_dir / "CMakeCache.txt").exists():
                raise RuntimeError(f"FERRY_CMAKE_PREBUILT={prebuilt}: not a configured CMake build folder")
            self._run(["cmake", "--build", str(build_dir), "--parallel", jobs, "--target",
                       "ferry_python", "ferry_cli", "ferry_cli_docs"])
        else:
            build_dir = pathlib.Path(os.environ.get("FERRY_CMAKE_BUILD_DIR") or temp / "cmake").resolve()
            self._run(self._configure(build_dir))
            self._run(["cmake", "--build", str(build_dir), "--parallel", jobs])
        staging = temp / "staging"
        shutil.rmtree(staging, ignore_errors=True)
        self._run(["cmake", "--install", str(build_dir), "--prefix", str(staging)])

        extensions = list(staging.rglob("ferry/_ferry*.so"))
        if len(extensions) != 1:
            raise RuntimeError(f"expected one ferry/_ferry*.so under {staging}, found {extensions}")
        package_dir = pathlib.Path(self.get_ext_fullpath(ext.name)).resolve().parent
        shutil.copytree(extensions[0].parent, package_dir, dirs_exist_ok=True)
        # libferry under its SONAME (the name the extension asks the loader for).
        libraries = [p for p in staging.rglob("libferry.so.*") if p.name.count(".") == 2]
        if len(libraries) != 1:
            raise RuntimeError(f"expected one libferry.so.<major> under {staging}, found {libraries}")
        shutil.copy2(libraries[0], package_dir / libraries[0].name, follow_symlinks=True)

    @staticmethod
    def _configure(build_dir: pathlib.Path) -> list:
        command = [
            "cmake", "-S", str(ROOT), "-B", str(build_dir), "-DCMAKE_BUILD_TYPE=Release",
            "-DFERRY_BUILD_TESTS=OFF", "-DFERRY_BUILD_BENCH=OFF", "-DFERRY_BUILD_FUZZ=OFF",
            f"-DFERRY_PYTHON={sys.executable}", "-DFERRY_PYTHON_INSTALL_DIR=python",
            # A user's compiler may warn where ours does not (GCC 12 at -O3: -Wrestrict false
            # positives in libstdc++); warnings must not fail an install.
            "-DFERRY_WERROR=OFF",
        ]
        if shutil.which("ninja") and not (build_dir / "CMakeCache.txt").exists():
            command += ["-G", "Ninja"]  # a configured folder keeps its generator
        return command + shlex.split(os.environ.get("FERRY_CMAKE_ARGS", ""))

    @staticmethod
    def _run(command: list) -> None:
        print("setup.py:", " ".join(command), flush=True)
        subprocess.run(command, check=True)


setup(
    version=project_version(),
    # Not build/: that is where scripts/build.sh puts the CMake build.
    options={"build": {"build_base": "build-pip"}},
    ext_modules=[Extension("ferry._ferry", sources=[])],
    cmdclass={"build_ext": CMakeBuild},
)
