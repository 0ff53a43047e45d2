"""python -m radixmesh.bench (the same as ``radixmesh bench``)."""

import sys

from .cli import main

sys.exit(main())
