"""Package list: every package under ctxbuild/ (found) plus templates/ as ctxbuild.templates (pyproject maps it).
pyproject's [tool.setuptools.packages.find] cannot add a mapped directory to what it finds."""
from setuptools import find_namespace_packages, setup

setup(packages=[*find_namespace_packages(include=["ctxbuild", "ctxbuild.*"]), "ctxbuild.templates"])
