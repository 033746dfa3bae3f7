import sys

from cadenza.cli.main import main

sys.exit(main())
