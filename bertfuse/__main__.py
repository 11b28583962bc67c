"""`python -m bertfuse ...`: the same command line as `bertfuse ...`."""

import sys

from bertfuse.cli import main

if __name__ == "__main__":
    sys.exit(main())
