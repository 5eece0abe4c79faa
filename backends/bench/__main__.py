"""python -m backends.bench ... (or under torchrun: -m backends.bench)."""

import sys

from backends.bench.cli import main

sys.exit(main())
