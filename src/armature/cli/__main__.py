"""`python -m armature.cli ...` (how `serve` starts its worker processes)."""

import sys

from armature.cli.main import main

sys.exit(main())
