import sys

from cachemgr.cli import main

sys.exit(main())
