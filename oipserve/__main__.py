import sys

from oipserve.app.cli import main

sys.exit(main())
