"""Pieces shared by every workload: logging, launch, precision, graphs, metering, the driver."""
