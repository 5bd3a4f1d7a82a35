import sys

from oipserve.cli import main

sys.exit(main())
