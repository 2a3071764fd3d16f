"""The emulated testbed: op-traces, the timing engine, network, devices, energy, faults.

No torch, no Ray, and nothing from the layers above (run, store, analysis, interfaces)."""
