"""Package discovery (metadata lives in pyproject.toml).

``environments/`` and ``tools/`` install as ``agentrl.environments`` and ``agentrl.tools`` (so a
user's own ``tools/`` folder never shadows them); every package under the three folders is found,
so a new subpackage cannot be left out of the wheel. scripts/ci_wheel.sh checks the built wheel
against the source tree.
"""

from setuptools import find_packages, setup

MAPPED = {"agentrl.environments": "environments", "agentrl.tools": "tools"}

packages = find_packages(include=["agentrl", "agentrl.*"])
for name, folder in MAPPED.items():
    packages += [name] + [f"{name}.{sub}" for sub in find_packages(folder)]

setup(packages=sorted(set(packages)), package_dir={"agentrl": "agentrl", **MAPPED})
