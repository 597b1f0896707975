"""Package list: every package under ctxbuild/ (found) plus templates/ as ctxbuild.templates (pyproject maps it).
pyproject's [tool.setuptools.packages.find] cannot add a mapped directory to what it finds.

The wheel is tagged py3-none-linux_x86_64, not py3-none-any: the code is pure Python, but what it needs
(onnxruntime-qnn's HTP compiler and simulator) exists only as a manylinux x86_64 wheel, so an `any` wheel
would install on macOS or aarch64 and fail at the first build. The tag makes pip refuse it there. (PyPI
would want a manylinux tag; ctxbuild is not published there.)"""
from setuptools import find_namespace_packages, setup

setup(packages=[*find_namespace_packages(include=["ctxbuild", "ctxbuild.*"]), "ctxbuild.templates"],
      options={"bdist_wheel": {"plat_name": "linux_x86_64"}})
