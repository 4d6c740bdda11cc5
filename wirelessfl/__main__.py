import sys

from wirelessfl.cli import main

sys.exit(main())
