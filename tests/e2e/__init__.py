"""End to end: the real CLI, or the QNN EP in-process, on models the tests generate."""
