"""``python -m botmesh`` runs the ``botmesh`` command line."""

import sys

from botmesh.cli import main

sys.exit(main())
