"""setup.py: packages the CUDA sources of plugins/ inside the wheel (trtllm_replayssm/_plugins) for NVRTC at run time.

Metadata lives in pyproject.toml. Editable installs read plugins/ from the checkout directly.
"""
from pathlib import Path
import shutil

from setuptools import setup
from setuptools.command.build_py import build_py


class BuildPyWithPlugins(build_py):
    def run(self) -> None:
        super().run()
        target = Path(self.build_lib) / "trtllm_replayssm" / "_plugins"
        target.mkdir(parents=True, exist_ok=True)
        for source in Path(__file__).parent.joinpath("plugins").glob("*.cu*"):
            shutil.copy2(source, target / source.name)


setup(cmdclass={"build_py": BuildPyWithPlugins})
