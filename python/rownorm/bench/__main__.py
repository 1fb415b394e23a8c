"""``python -m rownorm.bench``: see :mod:`rownorm.bench.cli`."""

import sys

from rownorm.bench.cli import main

sys.exit(main())
