"""Which database errors a worker waits out, and which it does not."""

from django.db import InterfaceError, OperationalError

# The connection was lost or refused (a restart, a network blip): the same statement
# can succeed later. Any other DatabaseError is about the statement or its data, and
# retrying it unchanged would fail forever.
CONNECTION_ERRORS = (OperationalError, InterfaceError)
