"""Runs the `imaging-ai` command as `python -m imaging_ai`."""

import sys

from imaging_ai.cli import main

sys.exit(main())
