"""The GPU-resident pipeline: frames in GPU memory from upload to download, double-buffered."""
