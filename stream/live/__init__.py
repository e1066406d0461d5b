"""Live I/O: RTMP in and out, HLS, and the helpers that wire SwapStream into real streaming setups."""
