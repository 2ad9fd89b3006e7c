"""A module that fails to import, for the python harness's import-error case."""

raise RuntimeError("broken on purpose")
