"""``python -m lightning_loadguard.cli``: the ``loadguard`` command."""

import sys

from lightning_loadguard.cli import main

sys.exit(main())
