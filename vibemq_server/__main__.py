"""``python -m vibemq_server`` runs the broker, like ``vibemq-server``."""

import sys

from vibemq_server.cli import main

sys.exit(main())
