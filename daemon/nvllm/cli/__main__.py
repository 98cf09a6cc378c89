"""`python -m nvllm.cli`: the nvllm command."""

import sys

from nvllm.cli import main

sys.exit(main())
