"""Screens: the dashboard, a device's detail, the SSD replacement, bench, help."""
