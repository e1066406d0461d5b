"""Swappers: replace a target face with a source identity."""
