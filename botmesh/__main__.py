"""``python -m botmesh`` runs the ``botmesh`` command line."""

import sys

from botmesh._cli.exit import command_of, stop_on_sigterm_until_started

if command_of(sys.argv[1:]) == "worker":  # before the command line's imports
    stop_on_sigterm_until_started()

from botmesh._cli.main import main

sys.exit(main())
