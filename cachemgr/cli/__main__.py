import sys

from cachemgr.cli.main import main

sys.exit(main())
