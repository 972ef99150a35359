"""The suite's settings: the product's own, run as on a developer's machine.

The tests give every process a ``DATABASE_URL`` (the test database), which would
make each a deployment (``automechanica.deployment``): a key required, HTTPS only.
The suite serves plain HTTP on loopback, so it says it is not one; the processes it
starts inherit that from the environment.

Run in parallel (pytest-xdist), each test process has an embedded PostgreSQL of its
own (``var/pgdata-gw0``, ...; beside ``AUTOMECHANICA_PGDATA`` when that is set), not
only a database of its own: the fault tests crash-restart their server, which would
cut every other process's connections.
"""

import os

os.environ.setdefault("AUTOMECHANICA_DEPLOYMENT", "off")

from pathlib import Path

from automechanica.settings import *  # noqa: F403
from automechanica.settings import VAR_DIR

_xdist_worker = os.environ.get("PYTEST_XDIST_WORKER")
if _xdist_worker:
    EMBEDDED_PGDATA = Path(os.environ.get("AUTOMECHANICA_PGDATA", VAR_DIR / "pgdata"))
    if not EMBEDDED_PGDATA.name.endswith(f"-{_xdist_worker}"):  # not derived already
        EMBEDDED_PGDATA = EMBEDDED_PGDATA.with_name(f"{EMBEDDED_PGDATA.name}-{_xdist_worker}")
    os.environ["AUTOMECHANICA_PGDATA"] = str(EMBEDDED_PGDATA)  # for the commands it starts
