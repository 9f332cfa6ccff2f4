"""`python -m precdbg ...` is the `precdbg` command."""
import sys

from .cli import main

sys.exit(main())
