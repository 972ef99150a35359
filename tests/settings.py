"""The suite's settings: the product's own, run as on a developer's machine.

The tests give every process a ``DATABASE_URL`` (the test database), which would
make each a deployment (``automechanica.deployment``): a key required, HTTPS only.
The suite serves plain HTTP on loopback, so it says it is not one; the processes it
starts inherit that from the environment.
"""

import os

os.environ.setdefault("AUTOMECHANICA_DEPLOYMENT", "off")

from automechanica.settings import *  # noqa: F403
