"""Verify cost curves for controller tests, in single-token passes by draft length k."""

# the 1.5B Q4_K_M target on this project's 2-core VM, k = 0..16: blocks of 16 cost about 8
VM_CURVE = [1.0, 1.74, 2.38, 2.87, 3.56, 4.27, 5.5, 6.69, 7.2, 7.62, 8.0, 8.32, 8.3, 8.25, 8.22, 8.2, 8.9]
