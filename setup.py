"""Build step beside pyproject.toml (which holds the whole configuration): a wheel leaves
out the packages that no ``rung`` command needs. ``rung.tools`` (corpus generators, training,
eval of the demo model) stays in the sdist and in an editable install, where the tests and
bench/ import it (docs/architecture.md, "What a wheel carries")."""

import warnings

from setuptools import setup
from setuptools.command.build_py import build_py
from setuptools.warnings import InformationOnly

# An editable install of a package-dir mapping goes through setuptools' import finder, which
# always adds a note (not a warning) that folders named like the package could shadow it;
# no folder here is named rung, and a newcomer's install should not print it.
warnings.filterwarnings("ignore", "Editable installation", InformationOnly)

CHECKOUT_ONLY = ("rung.tools",)


class BuildPy(build_py):
    def finalize_options(self) -> None:
        super().finalize_options()
        # an editable install maps the source folders (dist.packages) and builds nothing
        # here, so this changes only what a wheel carries
        self.packages = [p for p in self.packages or []
                         if not any(p == c or p.startswith(c + ".") for c in CHECKOUT_ONLY)]


setup(cmdclass={"build_py": BuildPy})
