"""The build's one job pyproject.toml cannot state: the repository's top-level folders are
installed under the `trainyard` import root (DESIGN §1, §2).

`package_dir` maps `trainyard.<folder>` to `<folder>/` for every product folder, and the package
list is discovered (so a new engine package is never left out of the wheel). The wheel then holds
`trainyard/config/…`, `trainyard/plugins/…`, …; an editable install (`pip install -e .`) serves
the same names from the checkout through setuptools' editable finder. Metadata, dependencies and
extras stay in pyproject.toml.
"""

from setuptools import find_packages, setup

ROOT = "trainyard"
FOLDERS = ("config", "plugins", "worker", "node_agent", "operators", "sensors", "dags", "cli")
"""The product's folders at the top of the repository (the layout is fixed; only the import name
is namespaced)."""

package_dir = {ROOT: ROOT} | {f"{ROOT}.{folder}": folder for folder in FOLDERS}
packages = [ROOT] + [f"{ROOT}.{name}" for folder in FOLDERS
                     for name in (folder, *(f"{folder}.{sub}" for sub in find_packages(folder)))]

setup(package_dir=package_dir, packages=packages)
