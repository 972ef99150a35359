"""The suite's settings: the product's own, run as on a developer's machine.

The tests give every process a ``DATABASE_URL`` (the test database), which would
make each a deployment (``automechanica.deployment``): a key required, HTTPS only.
The suite serves plain HTTP on loopback, so it says it is not one; the processes it
starts inherit that from the environment.

Run in parallel (pytest-xdist), each test process has an embedded PostgreSQL of its
own (``var/pgdata-gw0``, ...), not only a database of its own: the fault tests
crash-restart their server, which would cut every other process's connections. With
``AUTOMECHANICA_PGDATA`` set, all share that server: run them with ``-n 0``.
"""

import os

os.environ.setdefault("AUTOMECHANICA_DEPLOYMENT", "off")
# The suite's webhook receivers listen on loopback (tests/support/receiver.py).
os.environ.setdefault("ALERT_WEBHOOK_ALLOWED_NETWORKS", "127.0.0.0/8")

from automechanica.settings import *  # noqa: F403
from automechanica.settings import VAR_DIR

# Not when AUTOMECHANICA_PGDATA is set: the processes the tests start (which inherit
# PYTEST_XDIST_WORKER) and the embedded server's own tests set it, to a server they mean.
_xdist_worker = os.environ.get("PYTEST_XDIST_WORKER")
if _xdist_worker and "AUTOMECHANICA_PGDATA" not in os.environ:
    EMBEDDED_PGDATA = VAR_DIR / f"pgdata-{_xdist_worker}"
    os.environ["AUTOMECHANICA_PGDATA"] = str(EMBEDDED_PGDATA)  # for the commands it starts
