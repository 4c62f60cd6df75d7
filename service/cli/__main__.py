"""`python -m service.cli` (what `torchrun -m service.cli` launches): the `bradley` command."""

import sys

from service.cli.main import main

sys.exit(main())
