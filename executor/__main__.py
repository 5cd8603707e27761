"""``python -m executor CONSUMER_NAME``: one executor process (see ``executor.cli``)."""

import sys

from executor.cli import main

sys.exit(main())
