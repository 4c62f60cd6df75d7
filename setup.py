"""The one C extension: content ids hashed without the GIL (annotation/_sha256.c). `optional`: an
install without a C compiler or OpenSSL's headers goes on, and annotation/ids.py uses hashlib."""

from setuptools import Extension, setup

setup(ext_modules=[Extension("annotation._sha256", ["annotation/_sha256.c"], libraries=["crypto"],
                             optional=True)])
