"""``python -m hybridllm``: the ``hybridllm`` command, for a venv whose scripts folder is not on PATH."""

import sys

# the package's own hybridllm.cli (imported, not run as a second __main__ copy): its main() catches
# the _UsageError class its command groups raise, so a usage error exits 2, not 1
from hybridllm.cli import main

if __name__ == "__main__":
    sys.exit(main())
