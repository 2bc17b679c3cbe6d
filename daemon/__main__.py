import sys

from rung.daemon.cli import main

sys.exit(main())
