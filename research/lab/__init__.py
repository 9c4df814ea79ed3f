"""What the studies share: recorded traces and the noise-free replay (replay.py), the policies
replayed (policies.py), llama.cpp's default speculative policies ported to Python (llamacpp_policies.py)."""
