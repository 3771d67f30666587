# The control's stand-in for a stealer: a dependency's build reading a fake credential.
import os

from setuptools import setup

open(os.path.expanduser("~/.aws/credentials")).read()
setup(name="dep", version="1.0.0", py_modules=[])
