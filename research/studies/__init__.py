"""One module per study, each run as ``python -m research.studies.NAME`` from the repository root."""
