"""Backends: the kernel's objects as typed data and the operations on them, one module per
kind (bcache, dm-cache, SCSI, identity), plus the one snapshot of the host and target
resolution. No policy here; imports only core."""
