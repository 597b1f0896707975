"""QNN context binaries: the SoC table, libQnnSystem binding, inspection, wrapping, SoC read-back, staging, I/O
variants."""
