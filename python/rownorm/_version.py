"""The release version of rownorm: the one place it is written.

``setup.py`` reads ``VERSION`` from this file (without importing the package) and gives the
distribution ``VERSION`` plus a local label naming the CUDA major version the library is
compiled for, e.g. ``0.2.0+cu13``; the build info records both. ``rownorm.__version__`` is the
installed distribution's version (``importlib.metadata``), else the build info's, else this one.
"""

VERSION = "0.2.0.dev0"
