"""The lab: studies of specli's policies (replays, ports of llama.cpp's defaults, measured runs).
Not part of the installed package; run from the repository root, see research/README.md."""
