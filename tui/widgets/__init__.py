"""Widgets of the dashboard: the device tree, the trend sparklines, the action log."""
