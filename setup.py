"""Ship the top-level catalogs inside the wheel as ``wirelessfl/_catalog/<name>/*.yaml``.

The catalogs are data that users edit at the top of a checkout (docs/architecture.md); a
non-editable install must still find them, so they are mapped into the package here.
"""

from setuptools import find_packages, setup

CATALOGS = ("channels", "energy", "scenarios", "reproductions")

setup(
    packages=find_packages(include=["wirelessfl", "wirelessfl.*"])
    + [f"wirelessfl._catalog.{name}" for name in CATALOGS],
    package_dir={f"wirelessfl._catalog.{name}": name for name in CATALOGS},
    package_data={f"wirelessfl._catalog.{name}": ["*.yaml"] for name in CATALOGS},
)
