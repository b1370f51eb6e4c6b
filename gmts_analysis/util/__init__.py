"""Plumbing every layer uses: atomic files and JSON (io), progress bars, thread counts, shipped resources, figure style."""
