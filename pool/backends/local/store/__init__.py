"""The local backend's snapshot store.

Read-only layers on disk, written durably, checked by their manifests, read back on the host.
"""
