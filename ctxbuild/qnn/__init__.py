"""QNN context binaries: libQnnSystem binding, inspection, wrapping, SoC read-back, staging, I/O variants."""
