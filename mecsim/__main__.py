"""``python -m mecsim``: the ``mecsim`` command."""

import sys

from mecsim.interfaces.cli import main

sys.exit(main())
