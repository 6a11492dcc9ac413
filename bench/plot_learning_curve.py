"""Moved: use ``a3c plot RUN_DIR [RUN_DIR ...]`` (a3c_core/plot.py); this wrapper forwards to it."""
import sys

from a3c_core.cli import main

sys.exit(main(["plot", *sys.argv[1:]]))
