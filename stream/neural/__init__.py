"""Neural face analysis and swapping with the FaceFusion model zoo: detector pre- and post-processing,
recognition and the neural swappers, run through the runners in `swapstream.engines`."""
