"""The ``posenc`` command and what only it shows: the tour, the report, conformance files, the
schedule table."""
