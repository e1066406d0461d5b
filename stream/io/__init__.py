"""Getting frames in and out of SwapStream: video files through PyAV/FFmpeg."""
