"""`python -m bertfuse.cli`: the same entry point as `bertfuse` and `python -m bertfuse`."""

import sys

from bertfuse.cli import main

if __name__ == "__main__":
    sys.exit(main())
