"""``python -m botmesh`` runs the ``botmesh`` command line."""

import sys

from botmesh._cli import main

sys.exit(main())
