# The wheel carries a Linux x86-64 shared library (built by cargo, scripts/build-wheel.sh)
# and no Python extension: any CPython 3, this platform.
from setuptools import setup
from wheel.bdist_wheel import bdist_wheel


class PlatformWheel(bdist_wheel):
    def finalize_options(self):
        super().finalize_options()
        self.root_is_pure = False

    def get_tag(self):
        return "py3", "none", "linux_x86_64"


setup(cmdclass={"bdist_wheel": PlatformWheel})
