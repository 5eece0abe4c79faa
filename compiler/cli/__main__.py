import sys

from compiler.cli.main import main

sys.exit(main())
