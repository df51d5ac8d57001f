"""The simulator: cost model, reference and compiled engines, lower bound, Chrome traces, and the simulator as a measurer."""
